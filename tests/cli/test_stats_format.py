"""`rdmactl stats`: rates between two reads and the table layout."""

from __future__ import annotations

from typing import Any

from rdmad.cli_stats import add_rates, render


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
