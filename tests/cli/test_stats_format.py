"""`rdmactl stats`: rates between two reads, the table layout, and --watch's frames."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
from typing import Any

from rdmad.cli.main import parse_args
from rdmad.cli.stats import HOME_AND_CLEAR, add_rates, cmd_stats, render
from tests.cli.fake_client import FakeClient


def reading(**counters: int) -> dict[str, Any]:
    return {
        "devices": [
            {"device": "rxe0", "scope": "device", "ports": [{"port": 1, "counters": counters}]}
        ],
        "claims": [],
    }


def test_rates_are_per_second_since_the_last_read() -> None:
    now = reading(sent_pkts=300, rcvd_pkts=50)
    add_rates(now, reading(sent_pkts=100, rcvd_pkts=50), 2.0)
    assert now["devices"][0]["ports"][0]["rates"] == {"sent_pkts": 100.0, "rcvd_pkts": 0.0}


def test_a_counter_that_went_down_or_is_new_has_no_rate() -> None:
    now = reading(sent_pkts=5, link_downed=1)
    add_rates(now, reading(sent_pkts=100), 1.0)
    assert now["devices"][0]["ports"][0]["rates"] == {}


def test_table_has_one_row_per_counter_and_a_rate_column_when_watching() -> None:
    now = reading(sent_pkts=300)
    add_rates(now, reading(sent_pkts=100), 2.0)
    lines = render(now, rates=True).splitlines()
    assert lines[0].split() == ["OBJECT", "SCOPE", "PORT", "COUNTER", "VALUE", "PER", "SECOND"]
    assert lines[1].split() == ["rxe0", "device", "1", "sent_pkts", "300", "100.0"]


def test_a_port_without_counters_is_a_row_of_dashes_not_left_out() -> None:
    lines = render(reading(), rates=False).splitlines()
    assert lines[1:] == ["rxe0    device  1     -        -"]


class Screen(io.StringIO):
    """Where the frames go: a terminal or not; `printed` is set at each write."""

    def __init__(self, terminal: bool) -> None:
        super().__init__()
        self.terminal = terminal
        self.printed = asyncio.Event()

    def isatty(self) -> bool:
        return self.terminal

    def write(self, text: str) -> int:
        self.printed.set()
        return super().write(text)


def one_device() -> FakeClient:
    return FakeClient(
        {
            "ListDevices": [[("rxe0", "available", "eth0", "/io/rdmad1/device/rxe0")]],
            "ListClaims": [[]],
            "GetCounters": ["device", [(1, {"sent_pkts": 7})]],
        }
    )


def watch(*options: str) -> argparse.Namespace:
    return parse_args(["stats", "rxe0", "--watch", *options])


async def printed(args: argparse.Namespace, screen: Screen, until: str, count: int) -> str:
    """Run `rdmactl stats --watch` until `until` is out `count` times, then stop it (as
    Ctrl-C does); what it printed."""
    task = asyncio.create_task(cmd_stats(one_device(), args, screen))
    try:
        async with asyncio.timeout(10):
            while screen.getvalue().count(until) < count:
                screen.printed.clear()
                await screen.printed.wait()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return screen.getvalue()


async def frames(args: argparse.Namespace, screen: Screen, count: int) -> list[str]:
    return (await printed(args, screen, "OBJECT", count)).split("OBJECT")[1:]


async def test_watch_shows_the_counters_at_once_not_after_the_first_interval() -> None:
    (first,) = await frames(watch("--interval", "3600"), Screen(terminal=True), 1)
    # no rate yet: that takes a second reading
    assert first.splitlines()[1].split() == ["rxe0", "device", "1", "sent_pkts", "7", "-"]


async def test_watch_json_prints_objects_with_rates_only() -> None:
    args = parse_args(["--json", "stats", "rxe0", "--watch", "--interval", "0.01"])
    first = (await printed(args, Screen(terminal=False), "\n", 1)).splitlines()[0]
    assert json.loads(first)["devices"][0]["ports"][0]["rates"] == {"sent_pkts": 0.0}


async def test_watch_on_a_terminal_redraws_each_frame_in_place() -> None:
    first, _second = await frames(watch("--interval", "0.01"), Screen(terminal=True), 2)
    assert first.endswith(HOME_AND_CLEAR)


async def test_watch_into_a_file_or_pipe_separates_frames_by_a_blank_line() -> None:
    screen = Screen(terminal=False)
    first, _second = await frames(watch("--interval", "0.01"), screen, 2)
    assert first.endswith("\n\n") and HOME_AND_CLEAR not in screen.getvalue()


def test_a_claims_rdma_usage_is_a_row_per_resource_as_used_of_its_limit() -> None:
    data: dict[str, Any] = {
        "devices": [],
        "claims": [
            {
                "claim": "c1",
                "device": "rxe0",
                "scope": "device",
                "ports": [],
                "rdma": {"cgroup": "pod", "current": {"hca_handle": 1}, "max": {"hca_handle": 1}},
            }
        ],
    }
    lines = render(data, rates=False).splitlines()
    assert [line.split() for line in lines[1:]] == [
        ["claim", "c1", "(rxe0)", "cgroup", "-", "rdma.hca_handle", "1/1"],
        ["claim", "c1", "(rxe0)", "cgroup", "-", "rdma.hca_object", "0/max"],
    ]
