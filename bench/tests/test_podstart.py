"""The pod-start scenario's network and verdict (no root, no containerd)."""

from __future__ import annotations

from pathlib import Path

from bench.podstart import added_over_raw, network


def test_every_pod_gets_the_nodes_network_then_rdmad_cni_in_pod_mode() -> None:
    primary, chained = network("unix:path=/bus", Path("/ipam"))
    assert primary["type"] == "ptp" and primary["ipam"]["dataDir"] == "/ipam"
    assert chained == {"type": "rdmad", "pod": True, "busAddress": "unix:path=/bus"}


def test_what_rdma_adds_is_the_difference_of_the_medians_over_raws_median() -> None:
    assert added_over_raw([130.0, 140.0, 150.0], [100.0, 110.0, 120.0], [20.0, 25.0, 30.0]) == 1.2
