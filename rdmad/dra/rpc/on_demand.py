"""A grpc.aio server that exists only while it has work. While any grpc.aio server exists,
gRPC's C core keeps threads that wake several times a second on timers of their own
(docs/kubernetes.md, "Performance"); once the last one is stopped and dropped, the core
shuts down and those threads end. So this one is started for a connection and stopped
once no call has been in flight for IDLE_S."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

log = logging.getLogger("rdmad.dra")

# Long enough that the calls the kubelet makes together (registration's GetInfo and
# NotifyRegistrationStatus, a pod's prepare of several claims one after another) share
# one start; short, as each second a server lives costs about 7 wake-ups.
IDLE_S = 5.0
# The kubelet's own bound on a DRA call: a call that slipped in as an idle stop began
# is let finish.
IDLE_STOP_GRACE_S = 45.0


class _Counting(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Calls `begin` as each call of a known method starts and `end` as it ends."""

    def __init__(self, begin: Callable[[], None], end: Callable[[], None]) -> None:
        self._begin = begin
        self._end = end

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:  # unknown: no call to count
            return handler
        behaviour = handler.unary_unary

        async def counted(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            self._begin()
            try:
                return await behaviour(request, context)
            finally:
                self._end()

        return grpc.unary_unary_rpc_method_handler(
            counted,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


class OnDemandServer:
    """Serves `handlers` on the Unix socket `path` while it has work; `name` is what the
    log calls it."""

    def __init__(self, name: str, path: str, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self.path = path
        self._name = name
        self._handlers = tuple(handlers)
        self._server: grpc.aio.Server | None = None
        self._lock = asyncio.Lock()  # one start or stop at a time; a connection waits
        self._in_flight = 0
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_stop: asyncio.Task[None] | None = None
        self._closed = False

    async def running(self) -> None:
        """Started (after a stop under way ends), if it was not, with its idle time
        counted from now; once closed, not started again."""
        async with self._lock:
            if self._closed:
                return
            if self._server is None:
                self._server = await self._start()
            self._count_idle_from_now()

    async def close(self, grace: float) -> None:
        """Stopped for good, calls in flight given `grace` seconds."""
        async with self._lock:
            self._closed = True
            self._cancel_idle_timer()
            await self._stop(grace)
        if self._idle_stop is not None:
            await self._idle_stop

    async def _start(self) -> grpc.aio.Server:
        server = grpc.aio.server(interceptors=[_Counting(self._call_began, self._call_ended)])
        server.add_generic_rpc_handlers(self._handlers)
        server.add_insecure_port(f"unix:{self.path}")
        await server.start()
        log.debug("started the gRPC server for %s", self._name)
        return server

    async def _stop(self, grace: float) -> None:
        # Ours is the server's last reference: gone, it takes the core's threads with it.
        server, self._server = self._server, None
        if server is None:
            return
        await server.stop(grace)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _call_began(self) -> None:
        self._in_flight += 1
        self._cancel_idle_timer()

    def _call_ended(self) -> None:
        self._in_flight -= 1
        self._count_idle_from_now()

    def _count_idle_from_now(self) -> None:
        self._cancel_idle_timer()
        # None while a stop is under way: a call it let finish arms no timer.
        if self._in_flight == 0 and self._server is not None:
            self._idle_timer = asyncio.get_running_loop().call_later(IDLE_S, self._idled)

    def _cancel_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _idled(self) -> None:
        self._idle_timer = None
        self._idle_stop = asyncio.ensure_future(self._stop_if_idle())

    async def _stop_if_idle(self) -> None:
        async with self._lock:
            # A connection or a call since the timer fired counts the idle time anew.
            if self._idle_timer is not None or self._in_flight or self._server is None:
                return
            await self._stop(IDLE_STOP_GRACE_S)
            log.info("stopped the gRPC server for %s after %g s without a call", self._name, IDLE_S)
