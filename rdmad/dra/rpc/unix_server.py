"""A gRPC service on a Unix socket the kubelet dials, served by grpclib on the event loop.
It replaces a stale socket file of an earlier run and removes its own when it stops (the
kubelet watches these paths)."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import AsyncIterator, Sequence

from grpclib.server import Server

from rdmad.dra.rpc.api import Servable


def _remove_stale(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):  # never delete what is not ours to replace
        raise FileExistsError(f"{path} exists and is not a socket")
    os.unlink(path)


@contextlib.asynccontextmanager
async def serving(path: str, handlers: Sequence[Servable]) -> AsyncIterator[None]:
    """Serve `handlers` on `path` while the context lasts; calls still in flight when it
    ends are cancelled (the kubelet calls again)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _remove_stale(path)
    server = Server(list(handlers))
    await server.start(path=path)
    try:
        yield
    finally:
        # The file first: the kubelet's watcher sees the plugin go before calls fail.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        server.close()
        await server.wait_closed()
