"""CRI fixtures: a Kubernetes node without its kubelet. The real rdmad (sim devices bound to
real veths, on the suite's private bus), a private containerd whose pod network is rdmad-cni
(followed by a tap that records containerd's CNI calls), and a Kubelet making the CRI calls."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testbed.cni_plugin import PLUGIN
from testbed.cri.containerd import IMAGE, Containerd, private_containerd, require_containerd
from testbed.cri.image import write_image_archive
from testbed.cri.kubelet import Kubelet, Pod
from tests.cni.conftest import CniRig, running_rig

NETWORK = "rdmanet"  # CniRig.conf's name: its IPAM leases are under it


@pytest.fixture(autouse=True)
def containerd_node(root: None) -> None:
    """Every test here needs root, and containerd with what it runs (the `root` and
    `containerd` markers, from tests/conftest.py)."""
    require_containerd()
    assert PLUGIN.exists(), f"{PLUGIN} is not built: run scripts/build-cni.sh (or make setup)"


@pytest.fixture(scope="session")
def image_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("image") / "busybox.tar"
    write_image_archive(IMAGE, path)
    return path


@dataclass
class Node:
    rig: CniRig
    containerd: Containerd
    image_archive: Path
    tap_log: Path

    def rdmad(self, **keys: Any) -> dict[str, Any]:
        """rdmad-cni's entry in the pod network: this rig's rdmad, host-local IPAM."""
        conf = self.rig.conf(**keys)
        return {k: v for k, v in conf.items() if k not in ("cniVersion", "name")}

    async def start(self, *plugins: dict[str, Any]) -> Kubelet:
        """containerd with `plugins` (rdmad entries, chained; then the tap) as every pod's
        network."""
        tap = {"type": "cni-tap", "log": str(self.tap_log)}
        self.containerd.add_network(NETWORK, [*plugins, tap])
        cri = await self.containerd.start(self.image_archive)
        return Kubelet(cri, self.containerd.pod_logs)

    async def restart_containerd(self) -> Kubelet:
        """containerd SIGKILLed, as after a crash, and started again as its unit would;
        a Kubelet on the new one."""
        await self.containerd.kill()
        cri = await self.containerd.start(self.image_archive)
        return Kubelet(cri, self.containerd.pod_logs)

    def cni_calls(self) -> list[dict[str, str]]:
        """Each CNI call containerd made on the pod network, in order (tests/cri/cni_tap.py)."""
        if not self.tap_log.exists():
            return []
        return [json.loads(line) for line in self.tap_log.read_text().splitlines()]

    async def claims(self) -> list[list[Any]]:
        """rdmad's live claims: (id, device, netns, ifname, owner, path) each."""
        return list(await self.rig.client.manager("ListClaims"))

    async def claim_of(self, pod: Pod) -> str:
        """The id of the claim rdmad-cni made for the pod's eth0."""
        owner = f"cni/{NETWORK}/{pod.sandbox_id}/eth0"
        ids = [row[0] for row in await self.claims() if row[4] == owner]
        assert len(ids) == 1, f"no single claim owned by {owner}: {await self.claims()}"
        return str(ids[0])

    def cdi_edits(self, claim_id: str) -> dict[str, Any]:
        """The containerEdits of the claim's CDI spec, as rdmad wrote it."""
        spec = json.loads((self.rig.daemon.cdi_dir / f"rdmad.io-rdma-{claim_id}.json").read_text())
        (edits,) = {json.dumps(d["containerEdits"]) for d in spec["devices"]}
        return dict(json.loads(edits))


def _install_tap(containerd: Containerd) -> None:
    wrapper = containerd.home / "cni-tap"
    source = Path(__file__).with_name("cni_tap.py")
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {source} "$@"\n')
    wrapper.chmod(0o755)
    containerd.add_plugin("cni-tap", wrapper)


@contextlib.asynccontextmanager
async def running_node(
    bus_address: str, workdir: Path, image_archive: Path, sim_mode: str
) -> AsyncIterator[Node]:
    async with (
        running_rig(bus_address, workdir, sim_mode) as rig,
        private_containerd(rig.daemon.cdi_dir) as containerd,
    ):
        _install_tap(containerd)
        yield Node(rig, containerd, image_archive, workdir / "cni-calls")


@pytest.fixture
async def node(bus_address: str, tmp_path: Path, image_archive: Path) -> AsyncIterator[Node]:
    """RDMA netns mode shared (the kernel's default)."""
    async with running_node(bus_address, tmp_path, image_archive, "shared") as n:
        yield n


@pytest.fixture
async def exclusive_node(
    bus_address: str, tmp_path: Path, image_archive: Path
) -> AsyncIterator[Node]:
    """RDMA netns mode exclusive: a whole device's RDMA device moves with its netdev."""
    async with running_node(bus_address, tmp_path, image_archive, "exclusive") as n:
        yield n
