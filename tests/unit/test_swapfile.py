"""rdmad.swapfile: atomic replacement that frees no inode (renameat2 RENAME_EXCHANGE)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from rdmad import swapfile
from rdmad.swapfile import spare_of, write_swapped


def test_the_first_write_creates_the_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_swapped(path, b"one")
    assert path.read_bytes() == b"one"


def test_a_missing_directory_is_made(tmp_path: Path) -> None:
    path = tmp_path / "run" / "rdmad" / "state.json"
    write_swapped(path, b"one")
    assert path.read_bytes() == b"one"


def test_a_directory_removed_between_writes_is_made_again(tmp_path: Path) -> None:
    path = tmp_path / "rdmad" / "state.json"
    write_swapped(path, b"one")
    for p in path.parent.iterdir():
        p.unlink()
    path.parent.rmdir()
    write_swapped(path, b"two")
    assert path.read_bytes() == b"two"


def test_each_write_replaces_the_content(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    for data in (b"one", b"two", b"three"):
        write_swapped(path, data)
    assert path.read_bytes() == b"three"


def test_steady_state_writes_swap_two_inodes_and_create_none(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_swapped(path, b"first")
    write_swapped(path, b"second")  # creates the spare
    pair = {path.stat().st_ino, spare_of(path).stat().st_ino}
    seen = set()
    for i in range(6):
        write_swapped(path, f"write {i}".encode())
        seen.add(path.stat().st_ino)
    assert seen == pair  # no inode was created, so none was freed
    assert spare_of(path).read_bytes() == b"write 4"  # the spare holds the previous content


def test_a_torn_spare_is_never_read(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_swapped(path, b"whole")
    spare_of(path).write_bytes(b"{torn")  # as a crash in the middle of a write leaves it
    assert path.read_bytes() == b"whole"
    write_swapped(path, b"next")
    assert path.read_bytes() == b"next"


def test_a_failed_write_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_swapped(path, b"kept")
    spare_of(path).unlink(missing_ok=True)
    spare_of(path).mkdir()  # the spare cannot be opened for writing
    with pytest.raises(IsADirectoryError):
        write_swapped(path, b"lost")
    assert path.read_bytes() == b"kept"


def test_a_filesystem_that_cannot_swap_gets_a_plain_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unsupported(*_: object) -> int:
        import ctypes

        ctypes.set_errno(errno.EINVAL)
        return -1

    monkeypatch.setattr(swapfile, "_renameat2", unsupported)
    path = tmp_path / "state.json"
    write_swapped(path, b"one")
    write_swapped(path, b"two")
    assert path.read_bytes() == b"two"
    assert not os.path.exists(spare_of(path))  # renamed over, as before
