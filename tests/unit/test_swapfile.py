"""rdmad.core.swapfile: atomic writes; a state file's rewrite frees no inode (renameat2
RENAME_EXCHANGE through one spare)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from rdmad.core import swapfile
from rdmad.core.swapfile import remove, write_new, write_swapped


def failing_write(_fd: int, _data: object) -> int:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_new_file_is_written_in_place(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    write_new(path, b"one")
    assert path.read_bytes() == b"one"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_new_file_is_never_written_over_one_that_exists(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_bytes(b"kept")
    with pytest.raises(FileExistsError):
        write_new(path, b"lost")
    assert path.read_bytes() == b"kept"


def test_a_new_file_that_cannot_be_written_whole_is_not_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A part written (a full disk) must not pass for a file torn by a crash.
    monkeypatch.setattr(os, "write", failing_write)
    with pytest.raises(OSError, match="No space left"):
        write_new(tmp_path / "a.json", b"one")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("write", ["new", "swapped"])
def test_a_missing_directory_is_made(tmp_path: Path, write: str) -> None:
    path = tmp_path / "run" / "rdmad" / "a.json"
    if write == "new":
        write_new(path, b"one")
    else:
        write_swapped(path, b"one", path.with_name(".spare"))
    assert path.read_bytes() == b"one"


def test_a_swapped_file_has_the_mode_asked_for_and_keeps_it_through_rewrites(
    tmp_path: Path,
) -> None:
    path, spare = tmp_path / "spec.json", tmp_path / ".spare"
    for data in (b"one", b"two", b"three"):
        write_swapped(path, data, spare, mode=0o644)
        assert stat.S_IMODE(path.stat().st_mode) & 0o044 == 0o044, "readable by others"


def test_a_swapped_write_replaces_the_content(tmp_path: Path) -> None:
    path, spare = tmp_path / "a.json", tmp_path / ".spare"
    for data in (b"one", b"two", b"three"):
        write_swapped(path, data, spare)
    assert path.read_bytes() == b"three"


def test_steady_state_rewrites_of_several_files_through_one_spare_create_no_inode(
    tmp_path: Path,
) -> None:
    spare = tmp_path / ".spare"
    files = [tmp_path / "a.json", tmp_path / "b.json"]
    for path in files:
        write_new(path, b"first")
    write_swapped(files[0], b"second", spare)  # creates the spare
    inodes = {p.stat().st_ino for p in (*files, spare)}
    for i in range(6):
        write_swapped(files[i % 2], f"write {i}".encode(), spare)
    assert {p.stat().st_ino for p in (*files, spare)} == inodes  # none created, none freed
    assert [p.read_bytes() for p in files] == [b"write 4", b"write 5"]
    assert spare.read_bytes() == b"write 3"  # the content last replaced


def test_a_torn_spare_is_never_read(tmp_path: Path) -> None:
    path, spare = tmp_path / "a.json", tmp_path / ".spare"
    write_new(path, b"whole")
    spare.write_bytes(b"{torn")  # as a crash in the middle of a write leaves it
    assert path.read_bytes() == b"whole"
    write_swapped(path, b"next", spare)
    assert path.read_bytes() == b"next"


def test_a_failed_swapped_write_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path, spare = tmp_path / "a.json", tmp_path / ".spare"
    write_new(path, b"kept")
    spare.mkdir()  # the spare cannot be opened for writing
    with pytest.raises(IsADirectoryError):
        write_swapped(path, b"lost", spare)
    assert path.read_bytes() == b"kept"


def test_a_filesystem_that_cannot_swap_gets_a_plain_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unsupported(*_: object) -> int:
        import ctypes

        ctypes.set_errno(errno.EINVAL)
        return -1

    monkeypatch.setattr(swapfile, "_renameat2", unsupported)
    path, spare = tmp_path / "a.json", tmp_path / ".spare"
    write_new(path, b"one")
    write_swapped(path, b"two", spare)
    assert path.read_bytes() == b"two"
    assert not spare.exists()  # renamed over, as before


def test_remove_takes_the_file_away_and_a_missing_one_is_no_error(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    write_new(path, b"one")
    remove(path)
    remove(path)
    assert not path.exists()
