"""A gRPC service on a Unix socket the kubelet dials, with a gRPC server behind it only
while the kubelet calls (rdmad/dra/rpc/on_demand.py): the event loop owns the socket and
relays each connection to the server's own socket in a private directory. It replaces
stale socket files of an earlier run and removes its own when it stops (the kubelet
watches these paths)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import AsyncIterator, Sequence

import grpc

from rdmad.dra.rpc.on_demand import OnDemandServer
from rdmad.dra.rpc.relay import relay

log = logging.getLogger("rdmad.dra")

EXIT_GRACE_S = 1.0  # for calls in flight when the plugin stops


def _remove_stale(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):  # never delete what is not ours to replace
        raise FileExistsError(f"{path} exists and is not a socket")
    os.unlink(path)


@contextlib.asynccontextmanager
async def serving(
    path: str, handlers: Sequence[grpc.GenericRpcHandler], private: str
) -> AsyncIterator[None]:
    """Serve `handlers` on `path` while the context lasts, their gRPC server on the socket
    `private`, in a directory only its owner may enter."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _remove_stale(path)
    # 0700: none but the relay (and root) reaches the server, as none but root reaches `path`.
    os.makedirs(os.path.dirname(private), mode=0o700, exist_ok=True)
    os.chmod(os.path.dirname(private), 0o700)
    _remove_stale(private)
    server = OnDemandServer(path, private, handlers)

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await server.running()
        except RuntimeError as e:  # gRPC could not bind its socket
            log.error("cannot start the gRPC server for %s: %s", path, e)
            writer.close()  # the call fails UNAVAILABLE; the kubelet calls again later
            return
        await relay(reader, writer, server.path)

    listener = await asyncio.start_unix_server(connected, path)
    try:
        yield
    finally:
        listener.close()
        # The file first: the kubelet's watcher sees the plugin go before calls fail.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        await server.close(EXIT_GRACE_S)
