"""Smoke test: the QEMU guest is what the guest tests expect.

Runs only inside tests/guest/harness/run-in-guest.sh (RDMA_VM_GUEST=1). Collected anywhere
else it FAILS on purpose: a guest run that silently lands on the host must not look green.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.guest, pytest.mark.on_61]

RDMA_MODULES = ("ib_core", "ib_uverbs", "rdma_ucm", "rdma_rxe", "veth", "dummy", "macvlan")


@pytest.fixture(autouse=True)
def _in_guest() -> None:
    if os.environ.get("RDMA_VM_GUEST") != "1":
        pytest.fail(
            "tests/guest runs only inside the RDMA guest: "
            "tests/guest/harness/run-guest-tests.sh --kernel 7.3|6.1",
            pytrace=False,
        )


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=60)


def test_kernel_matches_rdma_vm_kernel() -> None:
    want = os.environ.get("RDMA_VM_KERNEL", "")
    assert want in ("6.1", "7.3")
    assert platform.release().startswith(want + "."), (want, platform.release())


def test_rdma_modules_loaded() -> None:
    missing = [m for m in RDMA_MODULES if not Path("/sys/module", m).is_dir()]
    assert not missing, f"modules not loaded: {missing}"


def test_rdma_tool_answers_and_no_rxe_by_default() -> None:
    # `rdma dev` speaks NETLINK_RDMA: proves ib_core's nldev is up. The harness creates no
    # rxe device; tests create (and remove) their own.
    out = run("rdma", "dev").stdout
    assert "rxe" not in out, f"unexpected RDMA device left behind: {out!r}"
    assert "netns" in run("rdma", "system").stdout


def test_rdma_cm_char_device() -> None:
    assert Path("/dev/infiniband/rdma_cm").is_char_device()


def test_virtio_nic_present_in_init_net() -> None:
    nic = os.environ.get("RDMA_VM_NIC", "")
    assert nic, "RDMA_VM_NIC not exported"
    dev = Path("/sys/class/net", nic)
    assert dev.is_dir(), f"{nic} not in this netns"
    assert (dev / "device" / "driver").resolve().name == "virtio_net"


@pytest.fixture
def veth() -> Iterator[str]:
    name = f"smk{os.getpid() % 10000}"
    run("ip", "link", "add", name, "type", "veth", "peer", "name", name + "p")
    try:
        run("ip", "link", "set", name, "up")
        yield name
    finally:
        run("ip", "link", "del", name, check=False)


def test_rxe_can_be_created_and_removed(veth: str) -> None:
    # `rdma link add/delete` return after the device is (un)registered: no waiting needed.
    rxe = f"rxe_{veth}"
    run("rdma", "link", "add", rxe, "type", "rxe", "netdev", veth)
    try:
        assert rxe in run("rdma", "dev").stdout
        assert Path("/sys/class/infiniband", rxe).is_dir()
    finally:
        run("rdma", "link", "delete", rxe, check=False)
    assert rxe not in run("rdma", "dev").stdout


def test_read_only_tree_conventions() -> None:
    # The checkout is the host's, read-only over 9p: nothing may try to write .pyc files.
    assert sys.dont_write_bytecode
    assert os.geteuid() == 0
