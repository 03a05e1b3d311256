"""rdmad-dra as a real process, as systemd or a DaemonSet runs it, with its kubelet
directories under a test's temp dir and the loopback API server as its cluster."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from testbed.children import spawn
from testbed.daemon import ROOT
from testbed.dra.apiserver import ApiServer

WAIT = 60.0


@dataclass
class Plugin:
    proc: asyncio.subprocess.Process
    registry_dir: Path
    plugins_dir: Path
    driver: str
    pod_uid: str = ""  # given, the sockets are the pod's own (a rolling upgrade's names)
    log: list[str] = field(default_factory=list)
    _logged: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def registration_socket(self) -> Path:
        """kubeletplugin's names, the rolling upgrade's for a path that fits in sun_path."""
        instance = f"-{self.pod_uid}" if self.pod_uid else ""
        return self.registry_dir / f"{self.driver}{instance}-reg.sock"

    @property
    def endpoint(self) -> Path:
        instance = f"-{self.pod_uid}" if self.pod_uid else ""
        return self.plugins_dir / self.driver / f"dra{instance}.sock"

    async def wait_log(self, text: str, timeout: float = WAIT, nth: int = 1) -> str:
        """The `nth` line of the plugin's stderr that holds `text`."""

        async def scan() -> str:
            while True:
                lines = [line for line in self.log if text in line]
                if len(lines) >= nth:
                    return lines[nth - 1]
                self._logged.clear()
                await self._logged.wait()

        try:
            return await asyncio.wait_for(scan(), timeout)
        except TimeoutError:
            raise AssertionError(f"rdmad-dra never logged {text!r} {nth}x: {self.log}") from None

    async def stop(self) -> int:
        """SIGTERM, as systemd and the kubelet stop it; its exit status."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), WAIT)


def argv(
    api: ApiServer, bus_address: str, workdir: Path, extra: list[str] | None = None
) -> list[str]:
    workdir.mkdir(exist_ok=True)
    return [
        sys.executable,
        "-m",
        "rdmad.dra.plugin",
        "--kubelet-registrar-directory-path",
        str(workdir / "plugins_registry"),
        "--kubelet-plugins-directory-path",
        str(workdir / "plugins"),
        "--kubeconfig",
        str(api.kubeconfig(workdir)),
        "--node-name",
        api.node,
        "--bus-address",
        bus_address,
        "--driver-name",
        api.driver,
        *(extra or []),
    ]


@contextlib.asynccontextmanager
async def running_plugin(
    api: ApiServer,
    bus_address: str,
    workdir: Path,
    start_timeout: float = WAIT,
    extra: list[str] | None = None,
    pod_uid: str = "",
    root: Path = ROOT,
) -> AsyncIterator[Plugin]:
    """Started from the source tree `root`, and serving once it has said so on stderr
    (within `start_timeout`: the guest's emulated CPU needs longer); with `pod_uid`, as that
    pod of a DaemonSet."""
    instance = ["--pod-uid", pod_uid] if pod_uid else []
    proc = await spawn(  # signalled by the tests (SIGTERM): default dispositions
        *argv(api, bus_address, workdir, [*instance, *(extra or [])]),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(root)},
        cwd=root,  # `-m` puts the working directory first on the path
    )
    plugin = Plugin(proc, workdir / "plugins_registry", workdir / "plugins", api.driver, pod_uid)

    async def read_log() -> None:  # and keep the pipe drained, or its logging blocks
        assert proc.stderr is not None
        while line := await proc.stderr.readline():
            plugin.log.append(line.decode(errors="replace").rstrip())
            plugin._logged.set()

    reader = asyncio.ensure_future(read_log())
    try:
        await plugin.wait_log("serving DRA driver", start_timeout)
        yield plugin
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await reader
