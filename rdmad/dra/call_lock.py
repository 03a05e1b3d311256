"""Prepare and unprepare one at a time across the instances of the plugin on a node: during
a rolling upgrade the kubelet calls either of two, and may prepare a claim on one and
unprepare it on the other (docs/kubernetes.md, "Upgrades").

The lock is an open file description lock (fcntl F_OFD_SETLK) on a file in the plugin's
directory, the one the instances share. Each holder opens the file anew, so that two calls
of one process exclude each other as two processes' do, and a lock ends with its holder's
descriptor: when the call ends, and when its process exits, killed or not.

A call that finds the lock taken waits for it in a thread of its own, which owns the
descriptor it waits on until the call takes it: a call cancelled meanwhile (its process
stops, the kubelet gave up) leaves the thread to release the lock as soon as it gets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import struct
import threading
from collections.abc import AsyncIterator

log = logging.getLogger("rdmad.dra")

# struct flock: a write lock of the whole file (l_start 0, l_len 0); l_pid 0, as OFD locks
# require; "0q" pads it to the C struct's size.
_WHOLE_FILE = struct.pack("@hhqqi0q", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
_TAKEN = (errno.EAGAIN, errno.EACCES)


class CallLock:
    def __init__(self, path: str) -> None:
        self.path = path

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """The lock, for the context; OSError if its file cannot be opened."""
        fd = self._open()
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _WHOLE_FILE)
        except OSError as e:
            os.close(fd)
            if e.errno not in _TAKEN:
                raise
            log.info(
                "waiting for %s: another call or instance of the plugin is preparing or "
                "unpreparing",
                self.path,
            )
            fd = await self._waited()
        try:
            yield
        finally:
            os.close(fd)

    def _open(self) -> int:
        return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    async def _waited(self) -> int:
        """A descriptor holding the lock, opened and locked by a thread."""
        loop = asyncio.get_running_loop()
        got: asyncio.Future[int] = loop.create_future()

        def took(fd: int) -> None:  # on the loop
            if got.cancelled():
                os.close(fd)
            else:
                got.set_result(fd)

        def failed(error: OSError) -> None:  # on the loop
            if not got.cancelled():
                got.set_exception(error)

        def wait() -> None:  # in the thread
            fd = None
            try:
                fd = self._open()
                fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, _WHOLE_FILE)
            except OSError as e:
                if fd is not None:
                    os.close(fd)
                with contextlib.suppress(RuntimeError):  # the loop is closed: no one waits
                    loop.call_soon_threadsafe(failed, e)
                return
            try:
                loop.call_soon_threadsafe(took, fd)
            except RuntimeError:  # the loop is closed: no one to hand the lock to
                os.close(fd)

        threading.Thread(target=wait, name="rdmad-dra-call-lock", daemon=True).start()
        return await got
