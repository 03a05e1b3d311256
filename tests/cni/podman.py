"""The real podman (Debian's 4.3 with network_backend = "cni"), set up the way it ran on
these machines: runc and cgroupfs (the cgroups here are hybrid and crun refuses them),
1024 nofile/nproc limits (the sandbox refuses the runtimes' defaults), a busybox rootfs
instead of an image, and storage, networks and plugin dirs of its own under a temp dir."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testbed.cni_plugin import PLUGIN

BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "ip", "sleep", "cat", "ls")


def require_podman() -> None:
    missing = [t for t in ("podman", "runc") if shutil.which(t) is None]
    missing += [] if BUSYBOX.exists() else ["busybox-static"]
    if not missing:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"missing {', '.join(missing)} (scripts/bootstrap.sh), and CI=true is set")
    pytest.skip(f"needs {', '.join(missing)}")


@dataclass
class Podman:
    home: Path
    runtime: str = "runc"  # the 7.3 guest died under runc; it runs crun
    run_flags: tuple[str, ...] = ()  # extra `podman run` flags, e.g. --cgroups=disabled

    @property
    def rootfs(self) -> Path:
        return self.home / "rootfs"

    @property
    def networks(self) -> Path:
        return self.home / "networks"

    def setup(self) -> None:
        (self.rootfs / "bin").mkdir(parents=True)
        shutil.copy(BUSYBOX, self.rootfs / "bin" / "busybox")
        for applet in APPLETS:
            (self.rootfs / "bin" / applet).symlink_to("busybox")
        self.networks.mkdir()
        # The plugin reaches podman through the conflist's plugin dir, not a system dir.
        plugins = self.home / "plugins"
        plugins.mkdir()
        assert PLUGIN.exists(), f"{PLUGIN} is not built: run scripts/build-cni.sh (or make setup)"
        (plugins / "rdmad").symlink_to(PLUGIN)
        (self.home / "containers.conf").write_text(
            "[containers]\n"
            'default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n'
            "[engine]\n"
            f'runtime = "{self.runtime}"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            "[network]\n"
            'network_backend = "cni"\n'
            f'network_config_dir = "{self.networks}"\n'
            f'cni_plugin_dirs = ["{plugins}", "/usr/lib/cni"]\n'
        )

    def add_network(self, name: str, plugin: dict[str, Any]) -> None:
        conflist = {"cniVersion": "1.0.0", "name": name, "plugins": [plugin]}
        (self.networks / f"{name}.conflist").write_text(json.dumps(conflist))

    def __call__(self, *args: str, check: bool = True) -> str:
        cmd = [
            "podman",
            "--root",
            str(self.home / "storage"),
            "--runroot",
            str(self.home / "run"),
            "--storage-driver",
            "vfs",
            *args,
        ]
        env = {**os.environ, "CONTAINERS_CONF": str(self.home / "containers.conf")}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr}")
        return done.stdout

    def run(self, name: str, network: str, *command: str, detach: bool = False) -> str:
        flags = ["-d"] if detach else []
        return self(
            "run",
            *flags,
            *self.run_flags,
            "--name",
            name,
            "--network",
            network,
            "--rootfs",
            str(self.rootfs),
            *command,
        )

    def pid(self, name: str) -> int:
        return int(self("inspect", "--format", "{{.State.Pid}}", name).strip())

    def cleanup(self) -> None:
        self("rm", "-a", "-f", "-t", "0", check=False)
