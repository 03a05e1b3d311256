"""Replace a file's content atomically without freeing an inode: write a spare, swap it in.

rdmad's one way to write a file (the state file, the CDI specs): docs/performance.md,
"State files", measures what the swap saves a claim against temp file + rename.

The usual write-a-temp-file-then-rename frees the replaced file's inode and dentry, and the
kernel frees those through RCU, which starts a grace period. rdmad saves its state right
before each netns move, and a move waits in rcu_barrier() for every pending RCU callback:
a grace period started just before it costs the move that one plus another, one to two
scheduler ticks more (docs/kernel-notes.md, docs/performance.md). Swapping two files with
renameat2(RENAME_EXCHANGE) frees nothing: the new content goes into the spare file, the
swap makes it the live one, and the old content becomes the next spare.

A crash leaves the live file whole, old or new; only the spare can be torn, and nothing
reads it. Where the filesystem cannot swap, this falls back to a plain rename.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable
from pathlib import Path

AT_FDCWD = -100
RENAME_EXCHANGE = 1 << 1
SPARE_SUFFIX = ".next"

# errnos meaning "this filesystem or kernel cannot swap": fall back to rename
_CANNOT_SWAP = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP}


Renameat2 = Callable[[int, bytes, int, bytes, int], int]


def _load_renameat2() -> Renameat2 | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except AttributeError:  # glibc < 2.28
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


_renameat2: Renameat2 | None = _load_renameat2()


def spare_of(path: Path) -> Path:
    return path.with_name(path.name + SPARE_SUFFIX)


def write_swapped(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Make `data` the content of `path` atomically and durably (fsync of file and
    directory). `mode`: of a newly created file (before the umask). The directory is made
    when it is missing. OSError on failure, with `path` as it was."""
    spare = spare_of(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    try:
        fd = os.open(spare, flags, mode)
    except FileNotFoundError:
        # The first write, or the directory was removed (/run is a tmpfs): made only then,
        # not before every write, which is twice on each claim's way.
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(spare, flags, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    if not exchange(spare, path):
        os.rename(spare, path)  # the first write, or a filesystem that cannot swap
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically. False if `b` does not exist or swapping is unsupported."""
    if _renameat2 is None:
        return False
    if _renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.ENOENT and os.path.lexists(a):
        return False  # no live file yet
    if err in _CANNOT_SWAP:
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))
