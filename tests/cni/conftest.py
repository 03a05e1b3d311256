"""CNI fixtures: the real rdmad on a private bus with sim devices bound to real veths, and
the plugin run as a runtime runs it: its executable, CNI_* variables, the config on stdin."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from testbed.cni_plugin import PLUGIN
from tests.support import sim_rig

CNI_PLUGIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
PCI = {"sim0": "0000:5e:00.0", "sim1": "0000:5e:00.1"}
# A claim's CDI spec (its id is hex); a pod CDI name's is rdmad.io-rdma-pod.NAME.json.
CLAIM_SPECS = "rdmad.io-rdma-[0-9a-f]*.json"


def cni_path() -> str:
    """Where Debian's containernetworking-plugins are (host-local, static)."""
    found = [d for d in CNI_PLUGIN_DIRS if os.access(os.path.join(d, "host-local"), os.X_OK)]
    if not found:
        if os.environ.get("CI") == "true":
            pytest.fail("containernetworking-plugins (host-local) are missing, and CI=true")
        pytest.skip("needs containernetworking-plugins (host-local)")
    return ":".join(found)


@pytest.fixture(autouse=True)
def _root(root: None) -> None:
    """Every test here needs root (the `root` marker, from tests/conftest.py) and the plugin."""
    assert PLUGIN.exists(), f"{PLUGIN} is not built: run scripts/build-cni.sh (or make setup)"


@dataclass
class Outcome:
    code: int  # the process exit status
    out: dict[str, Any] | None  # stdout as JSON, None when empty
    stderr: str

    @property
    def error(self) -> int:
        assert self.out is not None and self.code != 0, f"expected an error: {self}"
        return int(self.out["code"])


@dataclass
class CniRig(sim_rig.Rig):
    workdir: Path
    cni_path: str
    ipam_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.ipam_dir = self.workdir / "ipam"

    def conf(self, version: str = "1.0.0", **keys: Any) -> dict[str, Any]:
        """A network config for this rig's rdmad; host-local IPAM unless ipam=None."""
        doc: dict[str, Any] = {
            "cniVersion": version,
            "name": "rdmanet",
            "type": "rdmad",
            "busAddress": self.daemon.bus_address,
            "ipam": {
                "type": "host-local",
                "subnet": "10.77.0.0/24",
                "routes": [{"dst": "10.78.0.0/16"}],
                "gateway": "10.77.0.1",
                "dataDir": str(self.ipam_dir),
            },
        }
        doc.update(keys)
        return {k: v for k, v in doc.items() if v is not None}

    def leases(self, network: str = "rdmanet") -> set[str]:
        """The addresses host-local has handed out on `network`."""
        directory = self.ipam_dir / network
        if not directory.is_dir():
            return set()
        return {p.name for p in directory.iterdir() if p.name[0].isdigit()}

    def run(
        self,
        command: str,
        conf: dict[str, Any] | bytes,
        netns: str = "",
        container: str = "ctr1",
        ifname: str = "net1",
        args: str = "",
        env: dict[str, str | None] | None = None,
    ) -> Outcome:
        return run_plugin(command, conf, self.cni_path, netns, container, ifname, args, env or {})


def run_plugin(
    command: str,
    conf: dict[str, Any] | bytes,
    path: str,
    netns: str = "",
    container: str = "ctr1",
    ifname: str = "net1",
    args: str = "",
    overrides: dict[str, str | None] | None = None,
    timeout: float = 60.0,
) -> Outcome:
    """One plugin process, with the environment a runtime gives it and nothing else."""
    env: dict[str, str | None] = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": container,
        "CNI_NETNS": f"/run/netns/{netns}" if netns else "",
        "CNI_IFNAME": ifname,
        "CNI_ARGS": args,
        "CNI_PATH": path,
    }
    env.update(overrides or {})
    stdin = conf if isinstance(conf, bytes) else json.dumps(conf).encode()
    done = subprocess.run(
        [str(PLUGIN)],
        input=stdin,
        env={k: v for k, v in env.items() if v is not None},
        capture_output=True,
        timeout=timeout,
    )
    text = done.stdout.decode().strip()
    return Outcome(done.returncode, json.loads(text) if text else None, done.stderr.decode())


@dataclass
class FakeIpam:
    """tests/cni/fake_ipam.py installed as the IPAM plugin `fake-ipam` in its own dir."""

    directory: Path

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        script = self.directory / "fake-ipam"
        source = Path(__file__).with_name("fake_ipam.py")
        script.write_text(f'#!/bin/sh\nexec {sys.executable} {source} "$@"\n')
        script.chmod(0o755)

    def ipam(self, **keys: Any) -> dict[str, Any]:
        """The `ipam` section naming it; keys: fail, stderr (see fake_ipam.py)."""
        return {"type": "fake-ipam", "log": str(self.directory / "calls"), **keys}

    def env(self, rig: CniRig) -> dict[str, str | None]:
        """CNI_PATH with the fake first."""
        return {"CNI_PATH": f"{self.directory}:{rig.cni_path}"}

    def calls(self) -> list[str]:
        """Each call it got, in order: "VERB CONTAINERID"."""
        log = self.directory / "calls"
        return log.read_text().splitlines() if log.exists() else []

    def verbs(self) -> list[str]:
        """The verb of each call it got, in order."""
        return [call.split()[0] for call in self.calls()]


@pytest.fixture
def fake_ipam(tmp_path: Path) -> FakeIpam:
    return FakeIpam(tmp_path / "fake-ipam")


@contextlib.asynccontextmanager
async def running_rig(
    bus_address: str, workdir: Path, sim_mode: str = "shared", extra: list[str] | None = None
) -> AsyncIterator[CniRig]:
    path = cni_path()
    async with sim_rig.running_rig(bus_address, workdir, sim_mode, extra, pci=PCI) as r:
        yield CniRig(r.daemon, r.client, r.nics, workdir, path)


@pytest.fixture
async def rig(bus_address: str, tmp_path: Path) -> AsyncIterator[CniRig]:
    async with running_rig(bus_address, tmp_path) as r:
        yield r


@pytest.fixture
async def exclusive_rig(bus_address: str, tmp_path: Path) -> AsyncIterator[CniRig]:
    async with running_rig(bus_address, tmp_path, "exclusive") as r:
        yield r
