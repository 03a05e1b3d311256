"""The state file: what a restarted daemon reads back is what it wrote, or a clear error."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from rdmad.errors import KernelError
from rdmad.model import CharDev, ChardevKind, Claim, ClaimPhase, HostConfig
from rdmad.store import MIN_LOG_LINES, CorruptState, State, Store, plain


def a_claim() -> Claim:
    return Claim(
        id="00112233aabbccdd",
        device="mlx5_0",
        netns_inode=4026532001,
        netns_path="/run/netns/pod",
        nsid=3,
        ifname="net0",
        shared=False,
        owner="ctr-1",
        created_at_us=1,
        netdev_moved=True,
        host=HostConfig(7, "eth1", 9000, True, ("10.0.0.1/24",), ""),
        chardevs=(CharDev(ChardevKind.UVERBS, "/dev/infiniband/uverbs0", 231, 192),),
        phase=ClaimPhase.PENDING,
    )


def test_saved_state_loads_back_equal(tmp_path: Path) -> None:
    store = Store(tmp_path)
    state = State([a_claim()], [HostConfig(9, "eth2", 1500, False, (), "")])
    store.save(state)
    assert store.load() == state


def test_plain_gives_the_json_asdict_gives() -> None:
    claim = a_claim()
    assert json.dumps(plain(claim), sort_keys=True) == json.dumps(asdict(claim), sort_keys=True)


def test_a_file_from_the_indented_format_still_loads(tmp_path: Path) -> None:
    # Written by rdmad before the compact format: an upgrade must find its claims.
    doc = {"version": 1, "claims": [asdict(a_claim())], "pending_restores": []}
    (tmp_path / "state.json").write_text(json.dumps(doc, indent=1, sort_keys=True))
    assert Store(tmp_path).load() == State([a_claim()], [])


def test_a_file_with_the_char_device_kinds_earlier_versions_kept_still_loads(
    tmp_path: Path,
) -> None:
    raw = {**asdict(a_claim()), "chardev_kinds": ["uverbs", "rdma_cm"]}
    doc = {"version": 1, "claims": [raw], "pending_restores": []}
    (tmp_path / "state.json").write_text(json.dumps(doc))
    assert Store(tmp_path).load() == State([a_claim()], [])


def test_a_claims_save_keeps_the_others_as_last_saved(tmp_path: Path) -> None:
    store = Store(tmp_path)
    a, b = a_claim(), replace(a_claim(), id="ffeeddccbbaa9988")
    store.save(State([a, b]))
    a.phase = ClaimPhase.ACTIVE
    store.save_claim(a, live=True, pending_restores=[])
    assert [c.phase for c in Store(tmp_path).load().claims] == [
        ClaimPhase.ACTIVE,
        ClaimPhase.PENDING,
    ]


def test_a_claims_save_appends_one_line_and_leaves_the_whole_file_alone(
    tmp_path: Path,
) -> None:
    # What keeps a save's cost the same with 1 claim or 4000.
    store = Store(tmp_path)
    store.save(State([replace(a_claim(), id=f"{i:016x}") for i in range(100)]))
    whole = store.path.read_bytes()
    store.save_claim(replace(a_claim(), id=f"{7:016x}"), live=True, pending_restores=[])
    assert store.path.read_bytes() == whole
    assert len(store.log_path.read_bytes().splitlines()) == 1


def test_an_ended_claim_is_gone_on_load(tmp_path: Path) -> None:
    store = Store(tmp_path)
    a, b = a_claim(), replace(a_claim(), id="ffeeddccbbaa9988")
    store.save(State([a, b]))
    store.save_claim(a, live=False, pending_restores=[])
    assert [c.id for c in Store(tmp_path).load().claims] == [b.id]


def test_a_new_claim_saved_alone_loads_after_the_others(tmp_path: Path) -> None:
    store = Store(tmp_path)
    a, b = a_claim(), replace(a_claim(), id="ffeeddccbbaa9988")
    store.save(State([a]))
    store.save_claim(b, live=True, pending_restores=[])
    assert Store(tmp_path).load() == State([a, b], [])


def test_the_log_is_folded_into_the_file_once_it_has_as_many_lines_as_claims(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path)
    claims = [replace(a_claim(), id=f"{i:016x}") for i in range(MIN_LOG_LINES + 1)]
    store.save(State(claims))
    for claim in claims:
        claim.phase = ClaimPhase.ACTIVE
        store.save_claim(claim, live=True, pending_restores=[])
    assert len(store.log_path.read_bytes().splitlines()) == len(claims)
    claims[0].phase = ClaimPhase.RELEASING
    store.save_claim(claims[0], live=True, pending_restores=[])
    assert store.log_path.read_bytes() == b""
    assert Store(tmp_path).load() == State(claims, [])


def test_changed_pending_restores_are_saved_with_a_claims_change(tmp_path: Path) -> None:
    store = Store(tmp_path)
    a = a_claim()
    store.save(State([a]))
    returned = HostConfig(9, "eth2", 1500, False, (), "")
    store.save_claim(a, live=False, pending_restores=[returned])
    assert Store(tmp_path).load() == State([], [returned])


def test_log_lines_from_before_the_last_whole_write_are_skipped(tmp_path: Path) -> None:
    # A crash between the whole write and the log's truncation leaves the old lines.
    store = Store(tmp_path)
    a = a_claim()
    store.save(State([a]))
    store.save_claim(a, live=False, pending_restores=[])
    stale = store.log_path.read_bytes()
    store.save(State([a]))
    store.log_path.write_bytes(stale)
    assert Store(tmp_path).load() == State([a], [])


def test_a_line_torn_by_a_crash_is_dropped_and_cut_off(tmp_path: Path) -> None:
    store = Store(tmp_path)
    a, b = a_claim(), replace(a_claim(), id="ffeeddccbbaa9988")
    store.save(State([a]))
    store.save_claim(b, live=True, pending_restores=[])
    whole = store.log_path.read_bytes()
    store.log_path.write_bytes(whole + whole[: len(whole) // 2])
    reader = Store(tmp_path)
    assert reader.load() == State([a, b], [])
    assert reader.log_path.read_bytes() == whole


def test_a_garbled_log_line_is_corrupt(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.save(State([a_claim()]))
    store.log_path.write_bytes(b"garbage\n")
    with pytest.raises(CorruptState):
        Store(tmp_path).load()


def test_a_failed_append_leaves_no_torn_line(tmp_path: Path) -> None:
    store = Store(tmp_path)
    a = a_claim()
    store.save(State([a]))
    store.log_path.unlink()
    store.log_path.mkdir()  # the log cannot be opened for writing: EISDIR
    with pytest.raises(KernelError, match="cannot write state log"):
        store.save_claim(a, live=False, pending_restores=[])
    store.log_path.rmdir()
    assert Store(tmp_path).load() == State([a], [])


def test_missing_file_is_empty_state(tmp_path: Path) -> None:
    assert Store(tmp_path / "nowhere").load() == State()


def test_torn_file_is_reported_as_corrupt(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.save(State([a_claim()]))
    data = store.path.read_bytes()
    store.path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptState):
        store.load()


def test_unknown_schema_version_is_corrupt(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.path.write_text('{"version": 99, "claims": [], "pending_restores": []}')
    with pytest.raises(CorruptState, match="schema version"):
        store.load()


def test_move_aside_keeps_the_evidence(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.path.write_text("garbage")
    store.log_path.write_text("more garbage")
    aside = store.move_aside()
    assert aside.read_text() == "garbage" and not store.path.exists()
    assert (tmp_path / "state.log.corrupt").read_text() == "more garbage"
    assert not store.log_path.exists()


def test_failed_write_is_a_kernel_error_and_keeps_the_old_file(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.save(State([a_claim()]))
    (tmp_path / "state.json.next").mkdir()  # the spare file cannot be written: EISDIR
    with pytest.raises(KernelError, match="cannot write state file"):
        store.save(State())
    assert store.load().claims == [a_claim()]
