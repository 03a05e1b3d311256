"""One connection relayed, byte for byte both ways, to a Unix socket: how the kubelet's
connections to the plugin's sockets reach its gRPC server, which exists only while it has
work (rdmad/dra/rpc/on_demand.py)."""

from __future__ import annotations

import asyncio
import contextlib

CHUNK = 64 * 1024


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):  # either side reset: the connection is over
        while data := await source.read(CHUNK):
            sink.write(data)
            await sink.drain()


async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> None:
    """Relay the connection of `reader`, `writer` to the socket at `path` until either side
    closes; then close both (HTTP/2 has no use for a half-closed connection)."""
    try:
        to_reader, to_writer = await asyncio.open_unix_connection(path)
    except OSError:  # no server there (the plugin is stopping): the client sees a close
        writer.close()
        return
    pumps = [
        asyncio.ensure_future(_pump(reader, to_writer)),
        asyncio.ensure_future(_pump(to_reader, writer)),
    ]
    try:
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pump in pumps:
            pump.cancel()
        for w in (to_writer, writer):
            w.close()  # after what was written to it is sent
