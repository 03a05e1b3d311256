"""The 8-rail pod scenario's plan of rails and its measuring loop (no root, no daemon)."""

from __future__ import annotations

from collections import Counter

from bench.pod import RAILS, Column, measure_pods, pod_rails, rail_options


def test_a_mixed_pod_has_four_whole_device_rails_then_four_shared() -> None:
    assert [r.shared for r in pod_rails(4)] == [False] * 4 + [True] * 4


def test_every_rail_has_its_own_interface_subnet_and_table() -> None:
    rails = pod_rails(0)
    for field in ("ifname", "subnet", "address", "table"):
        assert len({getattr(r, field) for r in rails}) == RAILS, field


def test_each_claim_asks_for_a_table_and_names_the_pod() -> None:
    opts = rail_options(pod_rails(4)[5], "pod1")
    assert opts["table"].value == 0 and opts["pod_cdi_name"].value == "pod1"
    assert opts["shared"].value is True and opts["ifname"].value == "rail5"


async def test_each_column_makes_reps_pods_and_releases_each_before_the_next() -> None:
    log: list[str] = []

    def column(name: str) -> Column:
        async def make() -> float:
            log.append(f"{name}+")
            return 1.0

        async def end() -> None:
            log.append(f"{name}-")

        return make, end

    cols = {name: column(name) for name in ("b2b", "once", "raw")}
    times = await measure_pods(cols, 6)
    assert {name: len(t) for name, t in times.items()} == {"b2b": 6, "once": 6, "raw": 6}
    assert all(log[i][:-1] == log[i + 1][:-1] for i in range(0, len(log), 2))
    assert Counter(log) == {f"{n}{op}": 7 for n in cols for op in "+-"}  # one warm-up rep
