"""rtnetlink events: link changes in init_net and nsid deletions, as rdmad.events.

A reader task awaits an AsyncIPRoute bound to RTMGRP_LINK and RTNLGRP_NSID. An overrun
(ENOBUFS) leaves pyroute2's socket object unusable, so the source re-subscribes on a fresh
socket and then emits Resync("rtnl"): anything lost before that is covered by the re-read.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
from typing import Any

from pyroute2 import AsyncIPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_DELLINK, RTM_DELNSID, RTM_NEWLINK, RTMGRP_LINK

from rdmad.backend import EventSink
from rdmad.events import Event, LinkChanged, LinkRemoved, NetnsGone, Resync
from rdmad.kernel.rtnl import netdev_from_msg
from rdmad.kernel.rtnl_msgs import lean_links

log = logging.getLogger(__name__)

RTNLGRP_NSID = 28
GROUPS = RTMGRP_LINK | (1 << (RTNLGRP_NSID - 1))
DEFAULT_RCVBUF = 1 << 20


def event_from_msg(msg: Any) -> Event | None:
    """The rdmad event an rtnetlink message means, or None for anything else."""
    kind = msg["header"]["type"]
    if kind == RTM_NEWLINK:
        return LinkChanged(netdev_from_msg(msg))
    if kind == RTM_DELLINK:
        return LinkRemoved(ifindex=int(msg["index"]), name=msg.ifname)
    if kind == RTM_DELNSID:
        nsid = msg.get_attr("NETNSA_NSID")
        return None if nsid is None else NetnsGone(nsid=int(nsid))
    return None


def _is_overrun(e: BaseException) -> bool:
    code = e.code if isinstance(e, NetlinkError) else getattr(e, "errno", None)
    return code == errno.ENOBUFS


class RtnlEventSource:
    """Implements rdmad.backend.EventSource. `rcvbuf` can be made tiny to provoke overruns."""

    def __init__(self, rcvbuf: int = DEFAULT_RCVBUF) -> None:
        self._rcvbuf = rcvbuf
        self._ipr: AsyncIPRoute | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, sink: EventSink) -> None:
        if self._task is not None:
            raise RuntimeError("RtnlEventSource already started")
        self._ipr = await self._subscribe()
        self._task = asyncio.get_running_loop().create_task(
            self._read(sink), name="rdmad-rtnl-events"
        )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None

    async def _subscribe(self) -> AsyncIPRoute:
        ipr = lean_links(AsyncIPRoute(rcvbuf=self._rcvbuf))
        try:
            await ipr.bind(groups=GROUPS)
        except BaseException:
            ipr.close()
            raise
        return ipr

    async def _read(self, sink: EventSink) -> None:
        while True:
            assert self._ipr is not None
            try:
                async for msg in self._ipr.get():
                    event = event_from_msg(msg)
                    if event is not None:
                        self._deliver(sink, event)
            except (NetlinkError, OSError) as e:
                if not _is_overrun(e):
                    raise
                log.warning("rtnetlink event socket overran; re-subscribing")
                self._ipr.close()
                self._ipr = await self._subscribe()
                self._deliver(sink, Resync("rtnl"))

    @staticmethod
    def _deliver(sink: EventSink, event: Event) -> None:
        try:
            sink(event)
        except Exception:  # a faulty sink must not kill the event stream
            log.exception("event sink failed on %r", event)
