"""The state file: what a restarted daemon reads back is what it wrote, or a clear error."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from rdmad.errors import KernelError
from rdmad.model import CharDev, ChardevKind, Claim, ClaimPhase, HostConfig
from rdmad.store import CorruptState, State, Store, plain


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


def test_a_save_encodes_again_only_the_claim_it_names(tmp_path: Path) -> None:
    # Every change to a claim is followed by its save: the others' JSON is reused.
    store = Store(tmp_path)
    a, b = a_claim(), replace(a_claim(), id="ffeeddccbbaa9988")
    store.save(State([a, b]))
    a.phase, b.phase = ClaimPhase.ACTIVE, ClaimPhase.RELEASING
    store.save(State([a, b]), changed=a)
    assert [c.phase for c in store.load().claims] == [ClaimPhase.ACTIVE, ClaimPhase.PENDING]


def test_a_save_naming_no_claim_encodes_them_all(tmp_path: Path) -> None:
    store = Store(tmp_path)
    a = a_claim()
    store.save(State([a]))
    a.phase = ClaimPhase.ACTIVE
    store.save(State([a]))
    assert store.load().claims[0].phase == ClaimPhase.ACTIVE


def test_a_claim_dropped_from_the_state_leaves_the_file(tmp_path: Path) -> None:
    store = Store(tmp_path)
    a, b = a_claim(), replace(a_claim(), id="ffeeddccbbaa9988")
    store.save(State([a, b]))
    store.save(State([b]), changed=a)
    assert [c.id for c in store.load().claims] == [b.id]


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
    aside = store.move_aside()
    assert aside.read_text() == "garbage" and not store.path.exists()


def test_failed_write_is_a_kernel_error_and_keeps_the_old_file(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.save(State([a_claim()]))
    (tmp_path / "state.json.next").mkdir()  # the spare file cannot be written: EISDIR
    with pytest.raises(KernelError, match="cannot write state file"):
        store.save(State())
    assert store.load().claims == [a_claim()]
