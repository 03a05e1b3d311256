"""RDMA limits of a real kernel's rdma cgroup controller on rxe: a shared claim with a
cgroup and limits writes the device's line into that cgroup's rdma.max; a process in the
cgroup gets no more contexts and objects than that (tests/support/verbs_probe.py, through
libibverbs); the bus shows what rdma.current shows; release and the netns's death put the
line back to max."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from dbus_fast import Variant

from rdmad.model import RdmaLimit
from testbed.daemon import Client
from testbed.net import eventually, temp_netns
from tests.support.cgroup_tree import MOUNT, line
from tests.support.rdma import CLAIM_IFACE, WAIT, Rxe, known_to_rdmad

pytestmark = [
    pytest.mark.guest,
    pytest.mark.on_61,
    pytest.mark.usefixtures("in_guest", "daemon_log_on_failure"),
]

ROOT = Path(__file__).resolve().parents[2]
PROBE_START = 120.0  # python's start in the emulated guest


async def claim(client: Client, rxe: Rxe, netns: str, cgroup: str, **limits: int) -> str:
    await known_to_rdmad(client, rxe.name)
    options = {"shared": Variant("b", True), "cgroup": Variant("s", cgroup)}
    options.update({k: Variant("u", v) for k, v in limits.items()})
    return str(await client.manager("Claim", "ssa{sv}", rxe.name, netns, options))


@contextlib.asynccontextmanager
async def probe(
    cgroup: str, netns: str, device: str, contexts: int, pds: int
) -> AsyncIterator[tuple[int, int]]:
    """A process of `cgroup`, in `netns`, holding what it got: (contexts, PDs)."""
    script = (
        f"echo $$ > {MOUNT / cgroup / 'cgroup.procs'} && exec ip netns exec {netns} "
        f"{ROOT / '.venv/bin/python'} -m tests.support.verbs_probe {device} {contexts} {pds}"
    )
    proc = await asyncio.create_subprocess_exec(
        "sh",
        "-c",
        script,
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        said = (await asyncio.wait_for(proc.stdout.readline(), PROBE_START)).decode()
        got = dict(pair.split("=") for pair in said.split())
        yield int(got["contexts"]), int(got["pds"])
    finally:
        proc.stdin.close()
        assert await asyncio.wait_for(proc.wait(), WAIT) == 0


async def test_a_claims_limit_caps_the_contexts_and_objects_of_its_cgroup(
    client: Client, netns: str, rxe: Rxe, cgroup: str
) -> None:
    path = await claim(client, rxe, netns, cgroup, hca_handles=1, hca_objects=3)
    assert line(cgroup, rxe.name) == RdmaLimit(1, 3)
    async with probe(cgroup, netns, rxe.name, contexts=2, pds=5) as got:
        assert got == (1, 3), "the second open and the fourth PD are refused"
        cg, current, limit = await client.call_raw("io.rdmad1", path, CLAIM_IFACE, "GetRdmaUsage")
        kernel = line(cgroup, rxe.name, "rdma.current")
        assert (cg, limit) == (cgroup, {"hca_handle": 1, "hca_object": 3})
        assert kernel is not None
        assert current == {"hca_handle": kernel.hca_handle, "hca_object": kernel.hca_object}
        assert kernel.hca_handle == 1
    await client.call_raw("io.rdmad1", path, CLAIM_IFACE, "Release")
    assert line(cgroup, rxe.name) == RdmaLimit()


async def test_outside_the_limit_a_process_gets_what_it_asks(
    client: Client, netns: str, rxe: Rxe, cgroup: str
) -> None:
    async with probe(cgroup, netns, rxe.name, contexts=2, pds=5) as got:
        assert got == (2, 5)


async def test_the_netns_death_puts_the_line_back_to_max(
    client: Client, rxe: Rxe, cgroup: str
) -> None:
    with temp_netns("dying") as netns:
        await claim(client, rxe, netns, cgroup, hca_handles=1)
        assert line(cgroup, rxe.name) == RdmaLimit(1, None)
    await eventually(lambda: line(cgroup, rxe.name) == RdmaLimit(), WAIT)
