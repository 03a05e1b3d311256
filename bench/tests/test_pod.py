"""The 8-rail pod scenario's plan of rails (no root, no daemon)."""

from __future__ import annotations

from bench.pod import RAILS, pod_rails, rail_options


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
