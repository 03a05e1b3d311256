"""The state files: what a restarted daemon reads back is what it wrote; a file it cannot read
is set aside and costs only what it held."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from rdmad.core.store import SCHEMA_VERSION, State, Store, claim_json, to_json
from rdmad.errors import KernelError
from rdmad.model import (
    Attachment,
    CharDev,
    ChardevKind,
    Claim,
    ClaimPhase,
    HoldSpec,
    HostConfig,
    Port,
    RdmaDevice,
)


def a_claim(claim_id: str = "00112233aabbccdd") -> Claim:
    return Claim(
        id=claim_id,
        device="mlx5_0",
        attachment=Attachment(
            4026532001,
            "/run/netns/pod",
            3,
            host=HostConfig(7, "eth1", 9000, True, ("10.0.0.1/24",), ""),
            netdev_moved=True,
        ),
        ifname="net0",
        shared=False,
        owner="ctr-1",
        created_at_us=1,
        chardevs=(CharDev(ChardevKind.UVERBS, "/dev/infiniband/uverbs0", 231, 192),),
        phase=ClaimPhase.PENDING,
    )


B = "ffeeddccbbaa9988"
RETURNED = HostConfig(9, "eth2", 1500, False, (), "")


def files_in(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def test_saved_state_loads_back_equal(tmp_path: Path) -> None:
    store = Store(tmp_path)
    state = State([a_claim()], [RETURNED])
    store.save(state)
    assert Store(tmp_path).load() == state


def test_the_device_an_exclusive_claim_moved_loads_back_equal(tmp_path: Path) -> None:
    moved = RdmaDevice(
        index=1,
        name="mlx5_0",
        ports=(Port(1, "ACTIVE", "LINK_UP", "eth1"),),
        netdev="eth1",
        netdev_ifindex=7,
        chardevs=("/dev/infiniband/uverbs0",),
    )
    claim = a_claim()
    claim.attached.rdma_moved, claim.attached.moved_device = True, moved
    state = State([claim], [])
    Store(tmp_path).save(state)
    assert Store(tmp_path).load() == state


def test_to_json_gives_the_json_asdict_gives() -> None:
    claim = a_claim()
    assert json.loads(to_json(claim)) == json.loads(json.dumps(asdict(claim)))


def test_each_claim_has_its_own_file_and_the_daemon_one_more(tmp_path: Path) -> None:
    Store(tmp_path).save(State([a_claim(), a_claim(B)], [RETURNED]))
    assert files_in(tmp_path) == [
        "claims/00112233aabbccdd.json",
        f"claims/{B}.json",
        "daemon.json",
    ]
    doc = json.loads((tmp_path / "claims" / f"{B}.json").read_text())
    assert doc["version"] == SCHEMA_VERSION and doc["claim"]["id"] == B
    doc = json.loads((tmp_path / "daemon.json").read_text())
    assert doc == {"version": SCHEMA_VERSION, "pending_restores": [json.loads(to_json(RETURNED))]}


def test_a_claims_save_keeps_the_others_as_last_saved(tmp_path: Path) -> None:
    store = Store(tmp_path)
    a, b = a_claim(), a_claim(B)
    store.save(State([a, b]))
    a.phase = ClaimPhase.ACTIVE
    store.save_claim(a, live=True, pending_restores=[])
    assert [c.phase for c in Store(tmp_path).load().claims] == [
        ClaimPhase.ACTIVE,
        ClaimPhase.PENDING,
    ]


def test_a_claims_save_writes_its_own_file_only(tmp_path: Path) -> None:
    # What keeps a save's cost the same with 1 claim or 4000.
    store = Store(tmp_path)
    store.save(State([a_claim(f"{i:016x}") for i in range(100)]))
    before = {p: (p.stat().st_ino, p.read_bytes()) for p in tmp_path.rglob("*.json")}
    changed = replace(a_claim(f"{7:016x}"), phase=ClaimPhase.ACTIVE)
    store.save_claim(changed, live=True, pending_restores=[])
    after = {p: (p.stat().st_ino, p.read_bytes()) for p in tmp_path.rglob("*.json")}
    assert [p.name for p in before if before[p] != after[p]] == [f"{7:016x}.json"]


def test_a_rewrite_swaps_in_the_spare_and_creates_no_inode(tmp_path: Path) -> None:
    # Nothing freed through RCU before the netns move that follows (rdmad.core.swapfile).
    store = Store(tmp_path)
    a, b = a_claim(), a_claim(B)
    store.save(State([a, b]))
    store.save_claim(a, live=True, pending_restores=[])  # makes the spare
    inodes = {p.stat().st_ino for p in (tmp_path / "claims").iterdir()}
    for phase in (ClaimPhase.ACTIVE, ClaimPhase.RELEASING):
        for claim in (a, b):
            claim.phase = phase
            store.save_claim(claim, live=True, pending_restores=[])
    assert {p.stat().st_ino for p in (tmp_path / "claims").iterdir()} == inodes
    assert files_in(tmp_path / "claims") == [".spare", f"{a.id}.json", f"{B}.json"]


def test_an_ended_claims_file_is_removed(tmp_path: Path) -> None:
    store = Store(tmp_path)
    a, b = a_claim(), a_claim(B)
    store.save(State([a, b]))
    store.save_claim(a, live=False, pending_restores=[])
    assert [c.id for c in Store(tmp_path).load().claims] == [b.id]
    assert not (tmp_path / "claims" / f"{a.id}.json").exists()


def test_a_new_claim_saved_alone_loads_with_the_others(tmp_path: Path) -> None:
    store = Store(tmp_path)
    a, b = a_claim(), a_claim(B)
    store.save(State([a]))
    store.save_claim(b, live=True, pending_restores=[])
    assert Store(tmp_path).load() == State([a, b], [])


def test_changed_pending_restores_are_saved_with_a_claims_change(tmp_path: Path) -> None:
    store = Store(tmp_path)
    a = a_claim()
    store.save(State([a]))
    store.save_claim(a, live=False, pending_restores=[RETURNED])
    assert Store(tmp_path).load() == State([], [RETURNED])


def test_a_whole_save_removes_the_files_of_claims_gone(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.save(State([a_claim(), a_claim(B)]))
    store.save(State([a_claim(B)]))
    assert files_in(tmp_path / "claims") == [f"{B}.json"]


def test_missing_directory_is_empty_state(tmp_path: Path) -> None:
    assert Store(tmp_path / "nowhere").load() == State()


# ---------------------------------------------------------------- unreadable files

UNREADABLE_CLAIM_FILES = {
    "torn": b'{"version": 2, "claim": {"id": "00112233',
    "empty": b"",
    "binary": bytes(range(256)),
    "wrong-schema": b'{"version": 99, "claim": {}}',
    "wrong-shape": b'{"version": 2, "claim": {"id": 5}}',
    "another claim's": f'{{"version": 2, "claim": {claim_json(a_claim(B))}}}'.encode(),
}


@pytest.mark.parametrize("kind", list(UNREADABLE_CLAIM_FILES))
def test_an_unreadable_claim_file_is_set_aside_and_the_other_claims_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    Store(tmp_path).save(State([a_claim(), a_claim(B)], [RETURNED]))
    bad = tmp_path / "claims" / "00112233aabbccdd.json"
    bad.write_bytes(UNREADABLE_CLAIM_FILES[kind])
    with caplog.at_level(logging.ERROR, logger="rdmad.core.store"):
        state = Store(tmp_path).load()
    assert state.claims == [a_claim(B)] and state.pending_restores == [RETURNED]
    [aside] = state.set_aside
    assert aside.parent == tmp_path / "aside" and aside.name.startswith(bad.name)
    assert aside.read_bytes() == UNREADABLE_CLAIM_FILES[kind], "the evidence is kept"
    assert not bad.exists()
    [record] = caplog.records
    assert record.getMessage().startswith(f"state file unreadable: {bad} (")


def test_an_unreadable_daemon_file_is_set_aside_and_the_claims_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    Store(tmp_path).save(State([a_claim()], [RETURNED]))
    (tmp_path / "daemon.json").write_bytes(b'{"version": 2, "pending_resto')
    with caplog.at_level(logging.ERROR, logger="rdmad.core.store"):
        state = Store(tmp_path).load()
    assert state.claims == [a_claim()] and state.pending_restores == []
    assert [p.parent.name for p in state.set_aside] == ["aside"]
    assert f"state file unreadable: {tmp_path / 'daemon.json'} (" in caplog.text


def test_the_daemon_file_set_aside_is_written_again_at_the_next_save(tmp_path: Path) -> None:
    (tmp_path / "daemon.json").write_bytes(b"garbage")
    store = Store(tmp_path)
    store.load()
    store.save(State())
    assert Store(tmp_path).load() == State()


# ---------------------------------------------------------------- failed writes


def test_a_failed_rewrite_is_a_kernel_error_and_keeps_the_old_file(tmp_path: Path) -> None:
    store = Store(tmp_path)
    a = a_claim()
    store.save(State([a]))
    (tmp_path / "claims" / ".spare").mkdir()  # the spare cannot be written: EISDIR
    a.phase = ClaimPhase.ACTIVE
    with pytest.raises(KernelError, match="cannot write state file"):
        store.save_claim(a, live=True, pending_restores=[])
    assert Store(tmp_path).load().claims == [a_claim()]


def test_a_failed_first_write_is_a_kernel_error(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.save(State())
    (tmp_path / "claims").rmdir()
    (tmp_path / "claims").write_bytes(b"")  # the claim's file cannot be made: ENOTDIR
    with pytest.raises(KernelError, match="cannot write state file"):
        store.save_claim(a_claim(), live=True, pending_restores=[])
    (tmp_path / "claims").unlink()
    assert Store(tmp_path).load() == State()


def test_a_claim_whose_first_write_failed_can_still_end(tmp_path: Path) -> None:
    # The core forgets a claim whose PENDING write failed (the disk was full).
    store = Store(tmp_path)
    store.save(State())
    (tmp_path / "claims").rmdir()
    (tmp_path / "claims").write_bytes(b"")
    with pytest.raises(KernelError):
        store.save_claim(a_claim(), live=True, pending_restores=[])
    store.save_claim(a_claim(), live=False, pending_restores=[])


# ---------------------------------------------------------------- schema 1

# Schema 1, as rdmad wrote it: the whole state at generation 3, then one line per claim's
# change. A claim's JSON without the fields added since (gids, cdi_name, ...).
OLD_CLAIM = (
    '{"id":"CLAIM_ID","device":"mlx5_0","netns_inode":4026532001,"netns_path":"/run/netns/pod",'
    '"nsid":3,"ifname":"net0","shared":false,"owner":"ctr-1","created_at_us":1,'
    '"netdev_moved":true,"rdma_moved":false,"host":{"ifindex":7,"name":"eth1","mtu":9000,'
    '"up":true,"addresses":["10.0.0.1/24"],"kind":""},"chardevs":[{"kind":"uverbs",'
    '"path":"/dev/infiniband/uverbs0","major":231,"minor":192}],"cdi_device":"",'
    '"ns_ifindex":0,"phase":"PHASE"}'
)


def old_claim(claim_id: str, phase: str) -> str:
    return OLD_CLAIM.replace("CLAIM_ID", claim_id).replace("PHASE", phase)


OLD_STATE_JSON = (
    '{"version":1,"generation":3,"claims":['
    + old_claim("00112233aabbccdd", "pending")
    + ","
    + old_claim("1111111111111111", "active")
    + '],"pending_restores":[{"ifindex":9,"name":"eth2","mtu":1500,"up":false,'
    '"addresses":[],"kind":""}]}'
)
OLD_STATE_LOG = (
    # from before generation 3's whole write, which holds it: skipped
    f'{{"g":2,"claim":{old_claim("2222222222222222", "active")}}}\n'
    f'{{"g":3,"claim":{old_claim("00112233aabbccdd", "active")}}}\n'
    '{"g":3,"ended":"1111111111111111"}\n'
    f'{{"g":3,"claim":{old_claim(B, "releasing")}}}\n'
    '{"g":3,"claim":{"id":"33'  # torn by a crash: never saved
)


def old_layout(directory: Path) -> None:
    (directory / "state.json").write_text(OLD_STATE_JSON)
    (directory / "state.log").write_text(OLD_STATE_LOG)
    (directory / "state.json.next").write_text("{the spare")


def test_the_old_state_file_and_its_log_are_converted_to_one_file_per_claim(
    tmp_path: Path,
) -> None:
    old_layout(tmp_path)
    state = Store(tmp_path).load()
    assert state == State(
        [
            replace(a_claim(), phase=ClaimPhase.ACTIVE),
            replace(a_claim(B), phase=ClaimPhase.RELEASING),
        ],
        [RETURNED],
    )
    assert files_in(tmp_path) == [
        "claims/00112233aabbccdd.json",
        f"claims/{B}.json",
        "daemon.json",
    ]
    assert Store(tmp_path).load() == state


def test_a_conversion_cut_short_by_a_crash_is_done_again(tmp_path: Path) -> None:
    old_layout(tmp_path)
    Store(tmp_path).load()
    old_layout(tmp_path)  # as if the crash came before the old files were removed
    (tmp_path / "claims" / f"{B}.json").write_bytes(b'{"version": 2, "clai')
    assert [c.phase for c in Store(tmp_path).load().claims] == [
        ClaimPhase.ACTIVE,
        ClaimPhase.RELEASING,
    ]


def test_an_old_file_in_the_indented_format_still_loads(tmp_path: Path) -> None:
    # Written by rdmad before the compact format: an upgrade must find its claims.
    doc = {"version": 1, "claims": [json.loads(claim_json(a_claim()))], "pending_restores": []}
    (tmp_path / "state.json").write_text(json.dumps(doc, indent=1, sort_keys=True))
    assert Store(tmp_path).load() == State([a_claim()], [])


def test_an_old_file_with_the_char_device_kinds_earlier_versions_kept_still_loads(
    tmp_path: Path,
) -> None:
    raw = {**json.loads(claim_json(a_claim())), "chardev_kinds": ["uverbs", "rdma_cm"]}
    doc = {"version": 1, "claims": [raw], "pending_restores": []}
    (tmp_path / "state.json").write_text(json.dumps(doc))
    assert Store(tmp_path).load() == State([a_claim()], [])


def test_an_unreadable_old_state_is_set_aside_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "state.json").write_text(OLD_STATE_JSON)
    (tmp_path / "state.log").write_bytes(b"garbage\n")
    with caplog.at_level(logging.ERROR, logger="rdmad.core.store"):
        state = Store(tmp_path).load()
    assert state.claims == [] and state.pending_restores == []
    assert sorted(p.name.split(".")[:2] for p in state.set_aside) == [
        ["state", "json"],
        ["state", "log"],
    ]
    assert (tmp_path / "aside").is_dir() and not (tmp_path / "state.json").exists()
    assert caplog.text.count("state file unreadable") == 2


# ---------------------------------------------------------------- claimant


def test_the_claimant_loads_back(tmp_path: Path) -> None:
    state = State([replace(a_claim(), claimant=1001)], [])
    Store(tmp_path).save(state)
    assert [c.claimant for c in Store(tmp_path).load().claims] == [1001]


def test_a_claim_saved_before_claimants_were_kept_loads_as_roots(tmp_path: Path) -> None:
    raw = json.loads(claim_json(a_claim()))
    del raw["claimant"]
    (tmp_path / "claims").mkdir()
    doc = {"version": SCHEMA_VERSION, "claim": raw}
    (tmp_path / "claims" / f"{raw['id']}.json").write_text(json.dumps(doc))
    assert [c.claimant for c in Store(tmp_path).load().claims] == [0]


# Claim files as rdmad wrote them before a claim's netns and what it moved there were an
# Attachment of their own: one flat object, a held claim's netns fields zero.
ACTIVE_FILE = (
    '{"version":2,"claim":{"id":"00112233aabbccdd","device":"mlx5_0","netns_inode":4026532001,'
    '"netns_path":"/run/netns/pod","nsid":3,"ifname":"net0","shared":false,"owner":"ctr-1",'
    '"created_at_us":1,"netdev_moved":true,"rdma_moved":false,"host":{"ifindex":7,'
    '"name":"eth1","mtu":9000,"up":true,"addresses":["10.0.0.1/24"],"kind":""},"chardevs":'
    '[{"kind":"uverbs","path":"/dev/infiniband/uverbs0","major":231,"minor":192}],"gids":[],'
    '"cdi_device":"","ns_ifindex":0,"phase":"pending","cdi_name":"","pod_cdi_name":"",'
    '"failure":"","netns_cookie":0,"route_table":0,"hold":null,"moved_device":null,'
    '"end_reason":null}}'
)
HELD_FILE = (
    '{"version":2,"claim":{"id":"ffeeddccbbaa9988","device":"mlx5_1","netns_inode":0,'
    '"netns_path":"","nsid":-1,"ifname":"eth2","shared":false,"owner":"","created_at_us":2,'
    '"netdev_moved":false,"rdma_moved":false,"host":null,"chardevs":[],"gids":[],'
    '"cdi_device":"rdmad.io/rdma=ffeeddccbbaa9988","ns_ifindex":0,"phase":"held",'
    '"cdi_name":"","pod_cdi_name":"","failure":"","netns_cookie":0,"route_table":0,'
    '"hold":{"pod_uid":"pod-1","mtu":0,"chardevs":["uverbs","rdma_cm"],"netdev":true},'
    '"moved_device":null,"end_reason":null}}'
)


def test_a_claim_file_written_before_attachments_loads_with_its_attachment(
    tmp_path: Path,
) -> None:
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims" / "00112233aabbccdd.json").write_text(ACTIVE_FILE)
    assert Store(tmp_path).load().claims == [a_claim()]


def test_a_held_claim_file_written_before_attachments_loads_with_none(tmp_path: Path) -> None:
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims" / f"{B}.json").write_text(HELD_FILE)
    (held,) = Store(tmp_path).load().claims
    assert (held.phase, held.attachment, held.hold) == (ClaimPhase.HELD, None, HoldSpec("pod-1"))


@pytest.mark.parametrize("written", [ACTIVE_FILE, HELD_FILE], ids=["active", "held"])
def test_a_claim_file_is_written_as_before_attachments(tmp_path: Path, written: str) -> None:
    """The same flat object, so that an rdmad downgraded across this change reads it."""
    claim_id = json.loads(written)["claim"]["id"]
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims" / f"{claim_id}.json").write_text(written)
    (claim,) = Store(tmp_path).load().claims
    Store(tmp_path / "again").save(State([claim], []))
    again = json.loads((tmp_path / "again" / "claims" / f"{claim_id}.json").read_text())
    expected = json.loads(written)
    # kept since: the claimant (absent, a claim is root's), the cgroup and its limit, the
    # MAC and addresses of its netdev in its netns
    expected["claim"] |= {
        "claimant": 0,
        "cgroup": "",
        "limit": None,
        "ns_mac": "",
        "ns_addresses": [],
    }
    assert again == expected
