"""A private containerd, configured as a Kubernetes node's: Debian sid's 2.1
(scripts/fetch-containerd.sh unpacks it, `make setup` runs that) with bookworm's runc, CDI on
and reading the test's CDI dir, the CNI networks the test gives it (rdmad-cni and the
containernetworking plugins in its bin dir), and the offline busybox image as both the pause
image and the workload. Root, state, socket, logs and the CNI dirs are its own, under one
temp dir; nothing of a system containerd is touched."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from testbed.children import spawn
from testbed.cni_plugin import PLUGIN
from testbed.cri.client import Cri
from testbed.cri.image import BUSYBOX

CACHE = Path(os.environ.get("RDMAD_CONTAINERD_CACHE", "/opt/rdmad-containerd"))
BIN = CACHE / "containerd2" / "usr" / "bin"
CNI_PLUGINS = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
IMAGE = "localhost/rdmad-test:busybox"
NAMESPACE = "k8s.io"  # the containerd namespace the CRI plugin keeps its pods in
START_TIMEOUT_S = 60.0


def require_containerd() -> None:
    """Skip without containerd, runc, busybox or the CNI plugins; FAIL under CI=true."""
    missing = [] if (BIN / "containerd").exists() else ["containerd (scripts/fetch-containerd.sh)"]
    missing += [] if shutil.which("runc") else ["runc"]
    missing += [] if BUSYBOX.exists() else ["busybox-static"]
    missing += [] if (CNI_PLUGINS / "host-local").exists() else ["containernetworking-plugins"]
    if not missing:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"missing {', '.join(missing)} (make setup), and CI=true is set")
    pytest.skip(f"needs {', '.join(missing)}")


_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def _config(home: Path, cdi_dir: Path, snapshotter: str, systemd_cgroup: bool) -> str:
    """containerd 2's version 3 config: CDI and NRI are on by default there (NRI's socket and
    plugin dirs are moved into `home`), the CRI plugin split into its images and runtime
    parts. `systemd_cgroup`: runc makes its cgroups through systemd, as on a node whose
    kubelet uses the systemd cgroup driver (a pod's cgroup_parent is then a slice)."""
    return f"""version = 3
root = "{home}/root"
state = "{home}/state"
[grpc]
  address = "{home}/containerd.sock"
[plugins.'io.containerd.internal.v1.opt']
  path = "{home}/opt"
[plugins.'io.containerd.nri.v1.nri']
  socket_path = "{home}/nri.sock"
  plugin_path = "{home}/nri/plugins"
  plugin_config_path = "{home}/nri/conf.d"
# `ctr images import` unpacks through the transfer service, whose default names overlayfs:
# where the node's snapshotter is another (the guest's "native"), it has none to unpack to.
[plugins.'io.containerd.transfer.v1.local']
  [[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
    platform = "linux/{_ARCH}"
    snapshotter = "{snapshotter}"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "{snapshotter}"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{IMAGE}"
[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = ["{cdi_dir}"]
  # The sandbox refuses the pause process's oom_score_adj of -998: without this every
  # RunPodSandbox fails in runc ("failed to update /proc/self/oom_score_adj").
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{home}/cni-bin"]
    conf_dir = "{home}/net.d"
""" + (_SYSTEMD_CGROUP if systemd_cgroup else "")


# the kubelet's docs' setting for its systemd driver (the runc runtime's other options keep
# their defaults)
_SYSTEMD_CGROUP = """[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = true
"""


@dataclass
class Containerd:
    home: Path
    cdi_dir: Path
    # overlayfs, containerd's default; "native" (plain copies) where the root is on an
    # overlay itself, as the guest's /tmp is: an overlay upper on one is EINVAL.
    snapshotter: str = "overlayfs"
    systemd_cgroup: bool = False
    proc: asyncio.subprocess.Process | None = None
    cri: Cri | None = None
    networks: list[str] = field(default_factory=list)

    @property
    def socket(self) -> Path:
        return self.home / "containerd.sock"

    @property
    def log_path(self) -> Path:
        return self.home / "containerd.log"

    @property
    def pod_logs(self) -> Path:
        """The kubelet's pod log dir (PodSandboxConfig.log_directory) for pod `uid`'s logs."""
        return self.home / "pods"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def add_plugin(self, name: str, executable: Path) -> None:
        """A CNI plugin `type` the networks can name."""
        (self.home / "cni-bin" / name).symlink_to(executable)

    def add_network(self, name: str, plugins: list[dict[str, Any]]) -> None:
        """A conflist; containerd's CRI uses the first by file name as every pod's network."""
        conflist = {"cniVersion": "1.0.0", "name": name, "plugins": plugins}
        index = len(self.networks)
        (self.home / "net.d" / f"{10 + index}-{name}.conflist").write_text(json.dumps(conflist))
        self.networks.append(name)

    async def start(self, image_archive: Path) -> Cri:
        """containerd up, with the image in, and ready as the kubelet checks it (Status)."""
        (self.home / "config.toml").write_text(
            _config(self.home, self.cdi_dir, self.snapshotter, self.systemd_cgroup)
        )
        env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/sbin:/usr/bin')}"}
        with open(self.log_path, "ab") as log:
            # Signalled by stop() (SIGTERM) and by the restart tests (SIGKILL).
            self.proc = await spawn(
                str(BIN / "containerd"),
                "--config",
                str(self.home / "config.toml"),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
            )
        if self.cri is not None:
            await self.cri.close()  # the channel to the containerd killed before
        self.cri = Cri(self.socket)
        exited = asyncio.ensure_future(self.proc.wait())
        ready = asyncio.ensure_future(self.cri.wait_ready(START_TIMEOUT_S))
        await asyncio.wait({exited, ready}, return_when=asyncio.FIRST_COMPLETED)
        if exited.done():
            ready.cancel()
            raise RuntimeError(f"containerd exited with {exited.result()}; log:\n{self.log()}")
        exited.cancel()
        if (error := ready.exception()) is not None:
            raise RuntimeError(f"containerd did not answer: {error}; log:\n{self.log()}")
        await self.import_image(image_archive)
        not_ready = await self.cri.not_ready()
        assert not not_ready, f"containerd is not ready: {not_ready}"
        return self.cri

    async def import_image(self, archive: Path) -> None:
        """An OCI archive's images into the CRI plugin's namespace, as a node is given an
        image without a registry (`ctr images import`)."""
        ctr = await asyncio.create_subprocess_exec(
            str(BIN / "ctr"),
            "--address",
            str(self.socket),
            "--namespace",
            NAMESPACE,
            "images",
            "import",
            "--snapshotter",
            self.snapshotter,
            str(archive),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        out, _ = await ctr.communicate()
        assert ctr.returncode == 0, f"ctr images import failed: {out.decode()}"

    async def kill(self) -> None:
        """SIGKILL, as after a crash: no chance to tidy anything; its pods' shims (not its
        children) live on, as they do on a node."""
        assert self.proc is not None and self.proc.returncode is None, "containerd is not running"
        self.proc.kill()
        await self.proc.wait()

    async def stop(self) -> None:
        """Every pod stopped and removed through CRI, as a drained node's kubelet leaves it,
        then containerd itself; then whatever a failed test left (shims, mounts) is
        removed too."""
        if self.cri is not None:
            with contextlib.suppress(Exception):
                for sandbox in await self.cri.list_pod_sandboxes():
                    await self.cri.stop_pod_sandbox(sandbox)
                    await self.cri.remove_pod_sandbox(sandbox)
            await self.cri.close()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        _kill_shims(self.socket)
        _unmount_under(self.home)
        shutil.rmtree(self.home, ignore_errors=True)


def _kill_shims(socket: Path) -> None:
    """SIGKILL the runc shims still serving `socket`'s containerd (they outlive it)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"containerd-shim-runc-v2") and str(socket).encode() in argv:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)


def _unmount_under(home: Path) -> None:
    """Lazily unmount what is still mounted under `home` (a container's rootfs), deepest
    first."""
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for point in sorted((m for m in mounts if m.startswith(f"{home}/")), reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def _new_node(cdi_dir: Path, snapshotter: str, systemd_cgroup: bool, cni: Path) -> Containerd:
    """A Containerd, not started, with rdmad-cni `cni` (as `rdmad`) and the
    containernetworking plugins in its CNI bin dir."""
    # A short path: the socket's must fit in sun_path (108 bytes).
    home = Path(tempfile.mkdtemp(prefix="rdmad-ctd-"))
    for sub in ("cni-bin", "net.d", "pods"):
        (home / sub).mkdir()
    node = Containerd(home, cdi_dir, snapshotter, systemd_cgroup)
    for plugin in CNI_PLUGINS.iterdir():
        if plugin.name != "rdmad":  # the package's, on a node with rdmad installed
            node.add_plugin(plugin.name, plugin)
    node.add_plugin("rdmad", cni)
    return node


@contextlib.asynccontextmanager
async def private_containerd(
    cdi_dir: Path, snapshotter: str = "overlayfs", systemd_cgroup: bool = False, cni: Path = PLUGIN
) -> AsyncIterator[Containerd]:
    """A Containerd to configure and start; stopped and removed afterwards, with its pods.
    `systemd_cgroup`: see _config; `cni`: the rdmad-cni binary (the checkout's build)."""
    node = _new_node(cdi_dir, snapshotter, systemd_cgroup, cni)
    try:
        yield node
    finally:
        await node.stop()
