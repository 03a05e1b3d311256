"""What a gRPC server costs while a client holds a server stream open and nothing is sent:
grpcio's (grpc.aio) against grpclib's (pure asyncio), each in a process of its own on a
Unix socket, the stream held by a grpcio client as the kubelet holds NodeWatchResources.
Wake-ups are context switches summed over the server's threads (/proc/PID/task/*/status).

    python -m bench.grpc_idle [SECONDS]
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf.empty_pb2 import Empty

from bench.common import context_switches

SERVICE, METHOD = "bench.Idle", "Watch"


async def _serve_grpcio(path: str) -> None:
    async def watch(_request: Any, _context: Any) -> AsyncIterator[Empty]:
        yield Empty()
        await asyncio.Event().wait()

    server = grpc.aio.server()
    handler = grpc.unary_stream_rpc_method_handler(
        watch, request_deserializer=Empty.FromString, response_serializer=Empty.SerializeToString
    )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler(SERVICE, {METHOD: handler})]
    )
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    await server.wait_for_termination()


async def _serve_grpclib(path: str) -> None:
    from grpclib.const import Cardinality, Handler
    from grpclib.server import Server, Stream

    async def watch(stream: Stream[Empty, Empty]) -> None:
        await stream.recv_message()
        await stream.send_message(Empty())
        await asyncio.Event().wait()

    class Idle:
        def __mapping__(self) -> dict[str, Handler]:
            route = f"/{SERVICE}/{METHOD}"
            return {route: Handler(watch, Cardinality.UNARY_STREAM, Empty, Empty)}

    server = Server([Idle()])
    await server.start(path=path)
    await server.wait_closed()


SERVERS = {"grpcio": _serve_grpcio, "grpclib": _serve_grpclib}


async def _measure(kind: str, seconds: float, directory: str) -> tuple[int, int]:
    """(threads, wake-ups over `seconds`) of a `kind` server holding one stream open."""
    path = os.path.join(directory, f"{kind}.sock")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.grpc_idle", "--serve", kind, path
    )
    try:
        async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
            await channel.channel_ready()
            call = channel.unary_stream(f"/{SERVICE}/{METHOD}")(b"")
            await call.read()  # the stream is open and served
            await asyncio.sleep(1.0)  # the server's start-up work is over
            before = context_switches(proc.pid)
            await asyncio.sleep(seconds)
            woke = context_switches(proc.pid) - before
            threads = len(os.listdir(f"/proc/{proc.pid}/task"))
            call.cancel()
    finally:
        proc.terminate()
        await proc.wait()
    return threads, woke


async def _main(seconds: float) -> None:
    print(f"| server | threads | wake-ups in {seconds:g} s with a stream held open |")
    print("| --- | --- | --- |")
    with tempfile.TemporaryDirectory() as directory:
        for kind in SERVERS:
            threads, woke = await _measure(kind, seconds, directory)
            print(f"| {kind} | {threads} | {woke} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        asyncio.run(SERVERS[sys.argv[2]](sys.argv[3]))
    else:
        asyncio.run(_main(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0))
