"""A grpc.aio server on a Unix socket that replaces a stale socket file of an earlier run
and removes its own when it stops (the kubelet watches these paths)."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import AsyncIterator, Sequence

import grpc


def _remove_stale(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):  # never delete what is not ours to replace
        raise FileExistsError(f"{path} exists and is not a socket")
    os.unlink(path)


@contextlib.asynccontextmanager
async def serving(path: str, handlers: Sequence[grpc.GenericRpcHandler]) -> AsyncIterator[None]:
    """Serve `handlers` on `path` while the context lasts."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _remove_stale(path)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(tuple(handlers))
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    try:
        yield
    finally:
        # The file first: the kubelet's watcher sees the plugin go before calls fail.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        await server.stop(grace=1.0)
