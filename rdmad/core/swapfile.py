"""How rdmad writes files: atomically, and its state files freeing no inode.

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

Nothing is fsynced. Every file rdmad writes describes kernel state (a netdev in a claim's
netns, a spec naming a claim's devices) that ends with the kernel, and the kernel serves a
written file to the next process whether or not it reached a disk: a daemon killed at any
step finds at its start what it wrote, so the write-ahead steps hold without a sync. A sync
would only keep the files through the kernel's own death, after which no claim is left to
finish: /run (the state's default) is a tmpfs, CDI specs are rewritten at start
(rdmad.daemon.cdi), and a state directory on a disk holds claims whose netns died with the
kernel, which start ends. On a disk each sync is a wait on a claim's way.
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
    _write(os.fspath(path), _NEW, 0o600, data)


def write_swapped(path: StrPath, data: bytes, spare: StrPath, mode: int = 0o600) -> None:
    """Make `data` the content of `path` (created if missing) through `spare`, on the same
    filesystem. `mode`: of a new spare, before the umask. OSError on failure, with `path`
    as it was."""
    name, spare_name = os.fspath(path), os.fspath(spare)
    _write(spare_name, _TRUNC, mode, data)
    if not _exchange(spare_name, name):
        os.rename(spare_name, name)  # no file to swap with, or a filesystem that cannot swap


def remove(path: Path) -> None:
    """Remove `path`; nothing if it is missing."""
    path.unlink(missing_ok=True)


# Plain strings below: pathlib's objects cost a save more than its system calls.


def _write(name: str, flags: int, mode: int, data: bytes) -> None:
    """Write `data` to the file `name`; on failure, no file `name` is left."""
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
    except OSError:
        # A part written (a full disk) must not pass for a file torn by a crash.
        os.unlink(name)
        raise
    finally:
        os.close(fd)


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
