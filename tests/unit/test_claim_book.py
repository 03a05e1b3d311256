"""The claim book's queries: each finds its claims by an index, so what a claim, a device's
view or a prepare costs does not grow with the claims on the node."""

from __future__ import annotations

from rdmad.core.claims import ClaimBook
from rdmad.model import Attachment, Claim, HoldSpec, HostConfig


def claim(n: int, device: str, *, netns: int = 0, pod_uid: str = "") -> Claim:
    return Claim(
        id=f"c{n}",
        device=device,
        attachment=None if pod_uid else Attachment(netns, "", -1),
        ifname=f"net{n}",
        shared=True,
        owner="",
        created_at_us=n,
        chardevs=(),
        hold=HoldSpec(pod_uid) if pod_uid else None,
    )


def test_a_devices_claims_are_its_own_and_leave_when_dropped() -> None:
    book = ClaimBook()
    a, b, other = claim(0, "mlx5_0"), claim(1, "mlx5_0"), claim(2, "mlx5_1")
    for c in (a, b, other):
        book.add(c)
    book.drop(a)
    assert book.of("mlx5_0") == [b]
    assert book.of("mlx5_2") == []


def test_a_pods_held_claims_are_found_by_its_uid_until_dropped() -> None:
    book = ClaimBook()
    held, mate, stranger = claim(0, "a", pod_uid="p1"), claim(1, "b", pod_uid="p1"), claim(2, "c")
    for c in (held, mate, stranger):
        book.add(c)
    book.drop(mate)
    assert book.held_for("p1") == [held]
    book.drop(held)
    assert book.held_for("p1") == []


def test_a_claim_given_its_netns_later_is_filed_under_it() -> None:
    book = ClaimBook()
    held = claim(0, "a", pod_uid="p1")
    book.add(held)
    held.attachment = Attachment(4026532001, "", -1)  # as Attach does, then saves it
    book.refile(held)
    assert book.in_netns_of(held) == [held]
    book.drop(held)
    assert book.in_netns_of(claim(1, "b", netns=4026532001)) == []


def test_a_claims_nsid_finds_it_once_filed_until_it_moves_or_is_dropped() -> None:
    book = ClaimBook()
    rail, mate, stranger = claim(0, "a"), claim(1, "b"), claim(2, "c")
    for c in (rail, mate, stranger):
        book.add(c)
    for c in (rail, mate):
        c.attached.nsid = 7  # as a placement does, then saves it
        book.refile(c)
    assert book.in_nsid(7) == [rail, mate]
    rail.attachment = None  # held again
    book.refile(rail)
    book.drop(mate)
    assert book.in_nsid(7) == []
    assert book.in_nsid(-1) == [stranger, rail]


def test_a_dropped_claim_is_not_filed_again() -> None:
    book = ClaimBook()
    gone = claim(0, "a")
    book.add(gone)
    book.drop(gone)
    gone.attached.nsid = 7
    book.refile(gone)
    assert book.in_nsid(7) == []


def test_a_netns_finds_its_claims_by_inode_once_filed_there() -> None:
    book = ClaimBook()
    rail, held, stranger = claim(0, "a", netns=11), claim(1, "b", pod_uid="p1"), claim(2, "c")
    for c in (rail, held, stranger):
        book.add(c)
    held.attachment = Attachment(11, "", -1)  # as Attach does, then refiles it
    book.refile(held)
    assert book.in_netns(11) == [rail, held]
    held.attachment = None  # held again
    book.refile(held)
    assert book.in_netns(11) == [rail]


def test_a_claim_that_took_a_netdev_is_found_by_its_ifindex_or_name_until_it_gives_it_back() -> (
    None
):
    book = ClaimBook()
    whole, held, stranger = claim(0, "a"), claim(1, "b", pod_uid="p1"), claim(2, "c")
    whole.attached.host = HostConfig(5, "eth0", 1500, True, ())
    for c in (whole, held, stranger):
        book.add(c)
    host = HostConfig(6, "eth1", 1500, True, ())
    held.attachment = Attachment(11, "", -1, host=host)  # as Attach does, then refiles it
    book.refile(held)
    assert book.on_host_netdev(5, "") == [whole]
    assert book.on_host_netdev(99, "eth0") == [whole]
    assert book.on_host_netdev(6, "eth0") == [held, whole]
    assert [book.took_netdev(d) for d in ("a", "b", "c")] == [True, True, False]
    held.attachment = None  # held again
    book.refile(held)
    book.drop(whole)
    assert book.on_host_netdev(5, "eth1") == [] and book.on_host_netdev(6, "") == []
    assert not book.took_netdev("a") and not book.took_netdev("b")
