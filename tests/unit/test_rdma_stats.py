"""STAT_GET (per-port hw counters) on hand-built bytes and on a reply captured from a real
kernel (tests/unit/fixtures/capture_stat_get.py), and the sysfs counter files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rdmad.kernel import rdma_nl as nl
from rdmad.kernel import rdma_stats as st
from rdmad.kernel.netlink import split
from tests.unit.test_rdma_nl import hdr, msg, nla, u32, u64

FIXTURES = Path(__file__).parent / "fixtures"


def entry(name: str, value: int) -> bytes:
    body = nla(st.ATTR_STAT_HWCOUNTER_ENTRY_NAME, name.encode() + b"\0")
    # the kernel puts u64s with nla_put_u64_64bit: a PAD attribute may come first
    body += nla(nl.Attr.PAD, b"") + nla(st.ATTR_STAT_HWCOUNTER_ENTRY_VALUE, u64(value))
    return nla(st.ATTR_STAT_HWCOUNTER_ENTRY | 0x8000, body)


def test_stat_get_request_carries_device_and_port_and_asks_for_an_ack() -> None:
    expected = hdr(32, (5 << 10) + 17, 0x5, 9) + nla(1, u32(2)) + nla(3, u32(1))
    assert st.get_port_stats(seq=9, index=2, port=1) == expected


def test_stat_get_reply_decodes_every_counter_in_order() -> None:
    table = entry("sent_pkts", 12) + entry("rcvd_pkts", 1 << 40)
    body = nla(1, u32(2)) + nla(2, b"rxe0\0") + nla(3, u32(1))
    body += nla(st.ATTR_STAT_HWCOUNTERS | 0x8000, table)
    (m,) = split(msg((5 << 10) + 17, 0, 9, body))
    stats = st.port_stats(m)
    assert (stats.dev_index, stats.dev_name, stats.port) == (2, "rxe0", 1)
    assert list(stats.counters.items()) == [("sent_pkts", 12), ("rcvd_pkts", 1 << 40)]


def test_stat_get_reply_without_a_counter_table_has_no_counters() -> None:
    (m,) = split(msg((5 << 10) + 17, 0, 9, nla(1, u32(2)) + nla(3, u32(1))))
    assert st.port_stats(m).counters == {}


@pytest.mark.parametrize("kernel", ["7.3", "6.1"])
def test_captured_kernel_reply_matches_what_iproute2_printed(kernel: str) -> None:
    raw = (FIXTURES / f"stat_get_rxe_{kernel}.bin").read_bytes()
    shown = json.loads((FIXTURES / f"stat_get_rxe_{kernel}.json").read_text())[0]
    (m, *_rest) = split(raw)
    assert nl.cmd_of(m.type) == st.CMD_STAT_GET
    stats = st.port_stats(m)
    assert (stats.dev_name, stats.port) == (shown["ifname"], shown["port"])
    expected = {k: v for k, v in shown.items() if isinstance(v, int) and k != "port"}
    assert stats.counters == expected
    assert stats.counters["sent_pkts"] > 0 and stats.counters["rcvd_pkts"] > 0


def test_sysfs_counters_read_both_directories_and_skip_lifespan(sysfs: Path) -> None:
    port = sysfs / "class/infiniband/mlx5_0/ports/1"
    (port / "counters").mkdir(parents=True)
    (port / "hw_counters").mkdir()
    (port / "counters/port_xmit_data").write_text("1000\n")
    (port / "hw_counters/out_of_buffer").write_text("3\n")
    (port / "hw_counters/lifespan").write_text("10\n")
    assert st.sysfs_port_counters("mlx5_0", 1) == {
        "port_xmit_data": 1000,
        "out_of_buffer": 3,
    }


def test_sysfs_counters_of_a_device_without_them_are_empty(sysfs: Path) -> None:
    assert st.sysfs_port_counters("rxe0", 1) == {}


def test_u64_counters_survive_the_full_range() -> None:
    (m,) = split(msg((5 << 10) + 17, 0, 1, nla(80, entry("x", 2**64 - 1))))
    assert st.port_stats(m).counters == {"x": 2**64 - 1}
