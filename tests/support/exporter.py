"""rdmad-exporter as a real process, and scraping it as Prometheus does (HTTP GET /metrics,
parsed with prometheus_client's own parser)."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import socket
import sys
import urllib.request
from collections.abc import AsyncIterator

from prometheus_client.parser import text_string_to_metric_families

from testbed.children import spawn
from testbed.daemon import ROOT

WAIT = 60.0
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Exporter:
    def __init__(self, proc: asyncio.subprocess.Process, port: int) -> None:
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.log: list[str] = []  # its stderr since it served: why a scrape said rdmad_up 0

    async def scrape_text(self) -> str:
        def get() -> str:
            with urllib.request.urlopen(self.url, timeout=WAIT) as reply:
                assert reply.status == 200
                return str(reply.read().decode())

        return await asyncio.to_thread(get)

    def scrape_blocking(self, times: int) -> list[str]:
        """GET /metrics `times` times in a row, from the calling (worker) thread, on plain
        http.client: the bodies, in order. Cheap enough to scrape a thousand times."""
        bodies = []
        for _ in range(times):
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT)
            try:
                conn.request("GET", "/metrics")
                reply = conn.getresponse()
                assert reply.status == 200
                bodies.append(reply.read().decode())
            finally:
                conn.close()
        return bodies

    async def scrape(self) -> Samples:
        """Every sample: (name, sorted labels) -> value."""
        text = await self.scrape_text()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def rss_kib(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            line = next(x for x in f if x.startswith("VmRSS:"))
        return int(line.split()[1])


@contextlib.asynccontextmanager
async def running_exporter(
    bus_address: str, timeout: float | None = None, start_wait: float = WAIT
) -> AsyncIterator[Exporter]:
    """Started, and serving once it has said so on stderr (within `start_wait`); `timeout`:
    its --timeout, how long a scrape waits for rdmad (its default unless given)."""
    port = free_port()
    options = ["--timeout", str(timeout)] if timeout is not None else []
    proc = await spawn(
        sys.executable,
        "-m",
        "rdmad.exporter.main",
        "--listen-address",
        f"127.0.0.1:{port}",
        "--bus-address",
        bus_address,
        *options,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stderr is not None
    drain: asyncio.Task[None] | None = None
    try:
        async with asyncio.timeout(start_wait):
            while b"serving /metrics" not in (line := await proc.stderr.readline()):
                assert line, "rdmad-exporter exited before serving"

        exporter = Exporter(proc, port)

        async def keep_stderr() -> None:  # read on: a full pipe would block its logging
            assert proc.stderr is not None
            while line := await proc.stderr.readline():
                exporter.log.append(line.decode(errors="replace").rstrip())

        drain = asyncio.ensure_future(keep_stderr())
        yield exporter
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
        if drain is not None:
            await drain
