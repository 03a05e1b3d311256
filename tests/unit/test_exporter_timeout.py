"""rdmad-exporter answers a scrape while rdmad hangs: rdmad_up 0, before Prometheus gives up."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import cast

import pytest

from rdmad.exporter.main import SCRAPE_TIMEOUT_S, RdmadCollector, RdmadReader, Snapshot, parse_args

PROMETHEUS_DEFAULT_SCRAPE_TIMEOUT_S = 10.0


class HungReader:
    """rdmad that never answers (SIGSTOPped, or stuck in the kernel)."""

    async def read(self) -> Snapshot:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    def close(self) -> None:
        pass


@pytest.fixture
def loop_thread() -> Iterator[asyncio.AbstractEventLoop]:
    """The exporter's main-thread loop, where its D-Bus reads run."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


def test_a_scrape_while_rdmad_hangs_is_rdmad_up_0_after_the_timeout(
    loop_thread: asyncio.AbstractEventLoop,
) -> None:
    collector = RdmadCollector(cast(RdmadReader, HungReader()), loop_thread, timeout=0.05)
    samples = {s.name: s.value for m in collector.collect() for s in m.samples}
    assert samples == {"rdmad_up": 0, "rdmad_exporter_scrape_errors_total": 1}


def test_the_default_timeout_leaves_prometheus_time_to_receive_the_answer() -> None:
    assert parse_args([]).timeout == SCRAPE_TIMEOUT_S <= PROMETHEUS_DEFAULT_SCRAPE_TIMEOUT_S / 2


def test_the_timeout_is_an_option() -> None:
    assert parse_args(["--timeout", "2.5"]).timeout == 2.5
