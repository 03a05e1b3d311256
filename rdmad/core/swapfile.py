"""How rdmad writes files: atomically, durably, and its state files freeing no inode.

The usual write-a-temp-file-then-rename frees the replaced file's inode (or, renaming to a
new name, the target's dentry), and the kernel frees those through RCU, which starts a grace
period. rdmad saves a claim's state right before its netns moves, and a move waits in
rcu_barrier() for every pending RCU callback: a grace period started just before it costs
the move that one plus another, one to two scheduler ticks more (docs/kernel-notes.md,
docs/performance.md, "What rdmad does because of the move"). So:

- a new file is written in place (`write_new`): nothing is replaced, nothing freed. Only a
  crash before `write_new` returned can tear it, so before anything relied on its content;
- an existing file is rewritten through a spare (`write_swapped`): the new content goes into
  the spare, renameat2(RENAME_EXCHANGE) swaps it in, and the old content becomes the spare.
  One spare serves every file of a filesystem: it holds whatever was last replaced, which
  nothing reads, and a crash can tear only it. Where the filesystem cannot swap, a plain
  rename.

Files other programs read (CDI specs) are swapped in the same way, through a spare of a
mode they can read: a pod's rewrite of its other specs comes right before its next claim's
move.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable
from pathlib import Path

AT_FDCWD = -100
RENAME_EXCHANGE = 1 << 1
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
_TRUNC = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC

# errnos meaning "this filesystem or kernel cannot swap": fall back to rename
_CANNOT_SWAP = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP}


Renameat2 = Callable[[int, bytes, int, bytes, int], int]
StrPath = str | os.PathLike[str]


def _load_renameat2() -> Renameat2 | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except AttributeError:  # glibc < 2.28
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


_renameat2: Renameat2 | None = _load_renameat2()


def write_new(path: Path, data: bytes) -> None:
    """Create `path` (mode 0600) holding `data`; FileExistsError if it exists. OSError on
    failure, with no file left."""
    name = os.fspath(path)
    _write(name, _NEW, 0o600, data)
    _sync_dirs(name)


def write_swapped(path: Path, data: bytes, spare: Path, mode: int = 0o600) -> None:
    """Make `data` the content of `path` (created if missing) through `spare`, on the same
    filesystem. `mode`: of a new spare, before the umask. OSError on failure, with `path`
    as it was."""
    swap_in(path, data, spare, mode)
    _sync_dirs(os.fspath(path), os.fspath(spare))


def swap_in(path: StrPath, data: bytes, spare: StrPath, mode: int = 0o600) -> None:
    """`write_swapped` but for the sync of the directory, which holds `spare` too: for
    files written in a batch, whose directory is synced once after the last (`sync_dir`).
    OSError on failure, with `path` as it was."""
    name, spare_name = os.fspath(path), os.fspath(spare)
    _write(spare_name, _TRUNC, mode, data)
    if not _exchange(spare_name, name):
        os.rename(spare_name, name)  # no file to swap with, or a filesystem that cannot swap


def sync_dir(directory: Path) -> None:
    """Make the entries of `directory`'s files (created, swapped, renamed) durable."""
    _sync_dirs(os.path.join(os.fspath(directory), ""))


def remove(path: Path) -> None:
    """Remove `path` durably; nothing if it is missing."""
    name = os.fspath(path)
    try:
        os.unlink(name)
    except FileNotFoundError:
        return
    _sync_dirs(name)


# Plain strings below: pathlib's objects cost a save more than its system calls.


def _write(name: str, flags: int, mode: int, data: bytes) -> None:
    """Write `data` to the file `name` and sync it; on failure, no file `name` is left."""
    try:
        fd = os.open(name, flags, mode)
    except FileNotFoundError:
        # The first write, or the directory was removed (/run is a tmpfs): made only then,
        # not before every write, which is twice on each claim's way.
        os.makedirs(os.path.dirname(name), exist_ok=True)
        fd = os.open(name, flags, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except OSError:
        # A part written (a full disk) must not pass for a file torn by a crash.
        os.unlink(name)
        raise
    finally:
        os.close(fd)


def _sync_dirs(*names: str) -> None:
    """Make the directory entries of the files `names` durable."""
    for directory in {os.path.dirname(name) for name in names}:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _exchange(a: str, b: str) -> bool:
    """Swap two paths atomically. False if `b` does not exist or swapping is unsupported."""
    if _renameat2 is None:
        return False
    if _renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.ENOENT and os.path.lexists(a):
        return False  # no file at b
    if err in _CANNOT_SWAP:
        return False
    raise OSError(err, os.strerror(err), a, None, b)
