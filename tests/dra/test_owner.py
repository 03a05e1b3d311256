"""The owner label of rdmad-dra's holds (rdmad/dra/owner.py): the claim's UID and the
device's name in the slice, read back as written, and the label before shared mode too."""

from __future__ import annotations

from rdmad.dra.owner import owner_label, parse_owner

UID = "0b9f2c1e-1111-4c3e-9a6e-000000000001"


def test_a_label_names_the_claim_and_the_device() -> None:
    assert owner_label(UID, "mlx5-0--share-2") == f"dra/{UID}/mlx5-0--share-2"
    assert parse_owner(owner_label(UID, "mlx5-0--share-2")) == (UID, "mlx5-0--share-2")


def test_a_label_written_before_shared_mode_is_still_the_claims() -> None:
    assert parse_owner(f"dra/{UID}") == (UID, "")


def test_labels_of_others_are_not_rdmad_dras() -> None:
    assert parse_owner("ctr-42") is None
    assert parse_owner("dra/") is None
