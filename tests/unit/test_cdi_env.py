"""The CDI spec of a claim: what a runtime injects, and the GID it tells the workload to use."""

from __future__ import annotations

from rdmad.daemon.cdi import claim_env, preferred_gid, spec_for
from rdmad.model import Attachment, CharDev, ChardevKind, Claim, Gid

LINK_LOCAL = "fe80:0000:0000:0000:5054:00ff:fe12:3456"
MAPPED = "0000:0000:0000:0000:0000:ffff:c000:020a"


def claim_with(*gids: Gid) -> Claim:
    return Claim(
        id="c1",
        device="rxe0",
        attachment=Attachment(4026532000, "/run/netns/a", 0, gids=gids),
        ifname="net1",
        shared=True,
        owner="",
        created_at_us=0,
        chardevs=(CharDev(ChardevKind.UVERBS, "/dev/infiniband/uverbs0", 231, 192),),
    )


def test_roce_v2_over_ipv4_is_preferred_to_link_local_and_v1() -> None:
    gids = (
        Gid(1, 0, LINK_LOCAL, "IB/RoCE v1", "net1"),
        Gid(1, 1, LINK_LOCAL, "RoCE v2", "net1"),
        Gid(1, 2, MAPPED, "IB/RoCE v1", "net1"),
        Gid(1, 3, MAPPED, "RoCE v2", "net1"),
    )
    assert preferred_gid(gids) == gids[3]


def test_without_ipv4_the_roce_v2_link_local_entry_is_used() -> None:
    gids = (Gid(1, 0, LINK_LOCAL, "IB/RoCE v1", "e"), Gid(1, 1, LINK_LOCAL, "RoCE v2", "e"))
    assert preferred_gid(gids) == gids[1]


def test_env_names_the_device_port_and_gid_index_for_nccl_and_rdmad() -> None:
    env = claim_env(claim_with(Gid(1, 3, MAPPED, "RoCE v2", "net1")))
    assert env == [
        "RDMAD_DEVICE=rxe0",
        "RDMAD_PORT=1",
        "RDMAD_GID_INDEX=3",
        "NCCL_IB_HCA==rxe0:1",
        "NCCL_IB_GID_INDEX=3",
    ]


def test_without_gids_the_env_names_only_the_device() -> None:
    assert claim_env(claim_with()) == ["RDMAD_DEVICE=rxe0", "NCCL_IB_HCA==rxe0"]


def test_spec_is_cdi_0_5_0_with_the_claims_nodes() -> None:
    spec = spec_for(claim_with())
    assert spec["cdiVersion"] == "0.5.0"
    devices = spec["devices"]
    assert isinstance(devices, list) and len(devices) == 1
    device = devices[0]
    assert device["name"] == "c1"
    assert device["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/infiniband/uverbs0", "type": "c", "major": 231, "minor": 192}
    ]
