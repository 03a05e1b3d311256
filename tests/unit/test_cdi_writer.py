"""rdmad.daemon.cdi.CdiWriter: one CDI spec file per live claim, and no other file in the CDI
directory but the spare its rewrites swap through."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from rdmad.core.claims import ClaimBook
from rdmad.daemon.cdi import CDI_KIND, SPARE, CdiWriter
from rdmad.model import Attachment, CharDev, ChardevKind, Claim, ReleaseReason


def claim(claim_id: str) -> Claim:
    return Claim(
        id=claim_id,
        device="mlx5_0",
        attachment=Attachment(4026532000, "/run/netns/pod1", 3),
        ifname="net0",
        shared=False,
        owner="pod1",
        created_at_us=1,
        chardevs=(CharDev(ChardevKind.UVERBS, "/dev/infiniband/uverbs0", 231, 192),),
    )


class Node:
    """The claims on record and a writer asking them for each claim's pod, as the core's."""

    def __init__(self, directory: Path) -> None:
        self.book = ClaimBook()
        self.writer = CdiWriter(directory, self.book.in_netns_of)

    def claim(self, claim: Claim) -> None:
        self.book.add(claim)
        self.writer.claimed(claim)

    def release(self, claim: Claim) -> None:
        self.book.drop(claim)
        self.writer.released(claim, ReleaseReason.REQUESTED)


def test_a_claim_gets_a_spec_every_runtime_can_read(tmp_path: Path) -> None:
    node = Node(tmp_path / "cdi")
    node.claim(claim("c1"))
    path = node.writer.path_for("c1")
    spec = json.loads(path.read_text())
    assert spec["kind"] == CDI_KIND
    assert spec["devices"][0]["name"] == "c1"
    nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert nodes == [{"path": "/dev/infiniband/uverbs0", "type": "c", "major": 231, "minor": 192}]
    assert stat.S_IMODE(path.stat().st_mode) & 0o044 == 0o044


def test_a_pods_rewrites_leave_only_the_spare_no_runtime_reads(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.claim(claim("c1"))
    c2 = claim("c2")
    node.claim(c2)
    node.release(c2)  # c1's spec rewritten: one rail again
    assert sorted(p.name for p in tmp_path.iterdir()) == [SPARE, "rdmad.io-rdma-c1.json"]
    assert not SPARE.endswith((".json", ".yaml"))


def test_a_rewrite_swaps_the_spare_in_and_frees_no_inode(tmp_path: Path) -> None:
    """A spec renamed over would free its old inode through RCU, right before the pod's next
    claim moves a netdev (rdmad.core.swapfile)."""
    node = Node(tmp_path)
    node.claim(claim("c1"))
    c2 = claim("c2")
    node.claim(c2)
    before = {p.stat().st_ino for p in tmp_path.iterdir()}
    gone = node.writer.path_for("c2").stat().st_ino
    node.release(c2)  # c1's spec rewritten: one rail again
    assert before - {gone} <= {p.stat().st_ino for p in tmp_path.iterdir()}
    assert "c2" not in node.writer.path_for("c1").read_text()


def test_release_removes_the_spec(tmp_path: Path) -> None:
    node = Node(tmp_path)
    c1 = claim("c1")
    node.claim(c1)
    node.release(c1)
    assert list(tmp_path.iterdir()) == []


def test_sync_at_start_keeps_exactly_the_live_claims_specs(tmp_path: Path) -> None:
    node = Node(tmp_path)
    for cid in ("gone", "live"):
        node.claim(claim(cid))
    (tmp_path / ".rdmad.io-rdma-live.json.tmp").write_text("{torn")  # left by a crash
    (tmp_path / "rdmad.io-rdma-live.json.next").write_text("{}")  # rdmad's spares before
    node.writer.sync([claim("live")])
    assert sorted(p.name for p in tmp_path.iterdir()) == [SPARE, "rdmad.io-rdma-live.json"]


@pytest.mark.parametrize("left", ["torn", "lost"])
def test_start_rewrites_a_spec_the_hosts_crash_left_torn_or_lost(tmp_path: Path, left: str) -> None:
    """Specs are not synced (rdmad.core.swapfile): what a crash of the host leaves of one,
    the next start writes whole again."""
    Node(tmp_path).claim(claim("live"))
    spec = tmp_path / "rdmad.io-rdma-live.json"
    whole = spec.read_bytes()
    if left == "torn":
        spec.write_bytes(b"")  # as an unsynced file can come back
    else:
        spec.unlink()
    Node(tmp_path).writer.sync([claim("live")])  # the next start's writer
    assert spec.read_bytes() == whole
