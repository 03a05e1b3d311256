"""The environment of a pod's CDI specs: one claim keeps its own; several share one value
per key, which describes all the pod's rails, and the pod CDI name lists all their nodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rdmad.core.claims import ClaimBook
from rdmad.daemon.cdi import CdiWriter, pod_env, pod_spec_for, spec_for
from rdmad.model import Attachment, CharDev, ChardevKind, Claim, Gid, ReleaseReason

POD = 4026532000
MAPPED = "0000:0000:0000:0000:0000:ffff:c000:02{:02x}"
LINK_LOCAL = "fe80:0000:0000:0000:5054:00ff:fe12:34{:02x}"
RDMA_CM = CharDev(ChardevKind.RDMA_CM, "/dev/infiniband/rdma_cm", 10, 58)


def rail(n: int, *, ifname: str = "", index: int = 3, gid: str = MAPPED, pod: str = "") -> Claim:
    return Claim(
        id=f"c{n}",
        device=f"mlx5_{n}",
        attachment=Attachment(
            POD, "", 1, gids=(Gid(1, index, gid.format(n), "RoCE v2", f"net{n}"),)
        ),
        ifname=ifname or f"net{n}",
        shared=True,
        owner="",
        created_at_us=n,
        chardevs=(CharDev(ChardevKind.UVERBS, f"/dev/infiniband/uverbs{n}", 231, 192 + n), RDMA_CM),
        pod_cdi_name=pod,
    )


def keys(env: list[str]) -> dict[str, str]:
    pairs = [e.split("=", 1) for e in env]
    assert len({k for k, _ in pairs}) == len(pairs), "a key given twice"
    return dict(pairs)


def test_one_claim_keeps_its_own_env() -> None:
    assert pod_env([rail(0)]) == [
        "RDMAD_DEVICE=mlx5_0",
        "RDMAD_PORT=1",
        "RDMAD_GID_INDEX=3",
        "NCCL_IB_HCA==mlx5_0:1",
        "NCCL_IB_GID_INDEX=3",
    ]


def test_rails_are_listed_by_interface_name_with_one_exact_match_sign() -> None:
    env = keys(pod_env([rail(2, ifname="net0"), rail(0, ifname="net2"), rail(1)]))
    assert env["NCCL_IB_HCA"] == "=mlx5_2:1,mlx5_1:1,mlx5_0:1"
    assert env["RDMAD_DEVICES"] == "mlx5_2,mlx5_1,mlx5_0"
    assert env["RDMAD_IFNAMES"] == "net0,net1,net2"
    assert env["RDMAD_PORTS"] == "1,1,1"
    assert env["RDMAD_GID_INDEXES"] == "3,3,3"


def test_several_claims_carry_no_per_claim_key() -> None:
    env = keys(pod_env([rail(0), rail(1)]))
    assert not {"RDMAD_DEVICE", "RDMAD_PORT", "RDMAD_GID_INDEX"} & env.keys()


def test_an_agreed_gid_index_is_nccls_one_index() -> None:
    env = keys(pod_env([rail(0), rail(1)]))
    assert env["NCCL_IB_GID_INDEX"] == "3"
    assert "NCCL_IB_ADDR_FAMILY" not in env and "NCCL_IB_ROCE_VERSION_NUM" not in env


def test_differing_gid_indexes_leave_nccl_to_pick_by_family_and_version() -> None:
    env = keys(pod_env([rail(0), rail(1, index=5)]))
    assert "NCCL_IB_GID_INDEX" not in env
    assert env["NCCL_IB_ADDR_FAMILY"] == "AF_INET"
    assert env["NCCL_IB_ROCE_VERSION_NUM"] == "2"
    assert env["RDMAD_GID_INDEXES"] == "3,5"


def test_rails_without_ipv4_gids_ask_for_ipv6() -> None:
    env = keys(pod_env([rail(0, gid=LINK_LOCAL), rail(1, index=4, gid=LINK_LOCAL)]))
    assert env["NCCL_IB_ADDR_FAMILY"] == "AF_INET6"


def test_a_rail_without_gids_makes_no_agreement() -> None:
    unread = rail(1)
    unread.attached.gids = ()
    env = keys(pod_env([rail(0), unread]))
    assert "NCCL_IB_GID_INDEX" not in env
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1"
    assert env["RDMAD_GID_INDEXES"] == "3,"


def test_each_spec_keeps_its_own_nodes_and_the_pods_env() -> None:
    pod = [rail(0), rail(1)]
    specs: list[Any] = [spec_for(c, pod_env(pod))["devices"] for c in pod]
    assert specs[0][0]["containerEdits"]["env"] == specs[1][0]["containerEdits"]["env"]
    paths = [[n["path"] for n in s[0]["containerEdits"]["deviceNodes"]] for s in specs]
    assert paths == [
        ["/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm"],
        ["/dev/infiniband/uverbs1", "/dev/infiniband/rdma_cm"],
    ]


def test_the_pod_cdi_name_lists_every_node_once() -> None:
    pod = [rail(1), rail(0)]
    devices: Any = pod_spec_for("web", pod, pod_env(pod))["devices"]
    assert [d["name"] for d in devices] == ["web"]
    assert [n["path"] for n in devices[0]["containerEdits"]["deviceNodes"]] == [
        "/dev/infiniband/uverbs0",
        "/dev/infiniband/rdma_cm",
        "/dev/infiniband/uverbs1",
    ]


@pytest.fixture
def book() -> ClaimBook:
    return ClaimBook()


@pytest.fixture
def writer(tmp_path: Path, book: ClaimBook) -> CdiWriter:
    return CdiWriter(tmp_path, book.in_netns_of)


def claimed_pod(writer: CdiWriter, book: ClaimBook, rails: int) -> list[Claim]:
    """`rails` claims of the pod "web", made one after the other."""
    pod = [rail(n, pod="web") for n in range(rails)]
    for c in pod:
        book.add(c)
        writer.claimed(c)
    return pod


def end(writer: CdiWriter, book: ClaimBook, claims: list[Claim], reason: ReleaseReason) -> None:
    for c in claims:
        book.drop(c)
        writer.released(c, reason)


def inodes(directory: Path) -> dict[str, int]:
    """Each file's inode: a rewrite swaps the spare's in."""
    return {p.name: p.stat().st_ino for p in directory.iterdir()}


def specs(directory: Path) -> list[Path]:
    """The spec files, as a runtime reads the directory (not the spare)."""
    return sorted(directory.glob("*.json"))


def test_a_release_rewrites_the_rest_of_the_pod(
    tmp_path: Path, book: ClaimBook, writer: CdiWriter
) -> None:
    pod = claimed_pod(writer, book, 3)
    end(writer, book, pod[:1], ReleaseReason.REQUESTED)
    names = [p.name for p in specs(tmp_path)]
    assert names == ["rdmad.io-rdma-c1.json", "rdmad.io-rdma-c2.json", "rdmad.io-rdma-pod.web.json"]
    for name in names:
        spec: Any = json.loads((tmp_path / name).read_text())
        assert keys(spec["devices"][0]["containerEdits"]["env"])["RDMAD_DEVICES"] == "mlx5_1,mlx5_2"


def test_the_pod_spec_goes_with_the_pods_last_claim(
    tmp_path: Path, book: ClaimBook, writer: CdiWriter
) -> None:
    pod = claimed_pod(writer, book, 2)
    end(writer, book, pod, ReleaseReason.REQUESTED)
    assert specs(tmp_path) == []


def test_a_dead_pods_specs_are_removed_one_by_one_never_rewritten(
    tmp_path: Path, book: ClaimBook, writer: CdiWriter
) -> None:
    pod = claimed_pod(writer, book, 3)
    written = inodes(tmp_path)
    end(writer, book, pod[:1], ReleaseReason.NETNS_GONE)
    del written["rdmad.io-rdma-c0.json"]
    assert inodes(tmp_path) == written  # none renamed in
    end(writer, book, pod[1:], ReleaseReason.NETNS_GONE)
    assert specs(tmp_path) == []


def test_a_gid_change_the_env_does_not_show_renames_no_spec_in(
    tmp_path: Path, book: ClaimBook, writer: CdiWriter
) -> None:
    pod = claimed_pod(writer, book, 2)
    written = inodes(tmp_path)
    pod[1].attached.gids = (*pod[1].gids, Gid(1, 2, MAPPED.format(1), "IB/RoCE v1", "net1"))
    writer.claim_changed(pod[1])
    assert inodes(tmp_path) == written


def test_a_gid_change_the_env_shows_rewrites_every_spec_of_the_pod(
    tmp_path: Path, book: ClaimBook, writer: CdiWriter
) -> None:
    pod = claimed_pod(writer, book, 2)
    pod[1].attached.gids = (Gid(1, 5, MAPPED.format(1), "RoCE v2", "net1"),)
    writer.claim_changed(pod[1])
    for path in specs(tmp_path):
        spec: Any = json.loads(path.read_text())
        assert keys(spec["devices"][0]["containerEdits"]["env"])["RDMAD_GID_INDEXES"] == "3,5"


def test_each_pod_cdi_name_of_a_netns_lists_all_its_claims(
    book: ClaimBook, writer: CdiWriter
) -> None:
    for c in (rail(0, pod="a"), rail(1, pod="b")):
        book.add(c)
        writer.claimed(c)
    for name in ("a", "b"):
        spec: Any = json.loads(writer.pod_path_for(name).read_text())
        nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
        assert len(nodes) == 3  # both uverbs, one rdma_cm
