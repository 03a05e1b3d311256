"""rdmad-exporter: Prometheus metrics of rdmad's devices, claims and operations.

Its own process, a read-only D-Bus client of rdmad: the daemon keeps its AF_UNIX/AF_NETLINK
sandbox and never opens a TCP port. Everything is read at scrape time (ObjectManager's
GetManagedObjects, each device's GetCounters, Manager.GetStatistics); nothing is polled in
between. rdmad down is `rdmad_up 0`, not an HTTP error. Metrics: docs/metrics.md.

The HTTP server (prometheus_client's) calls `collect()` on its own thread; the D-Bus
connection lives on the asyncio loop of the main thread, and a scrape hands its reads over.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import logging
import re
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from dbus_fast.aio import MessageBus
from dbus_fast.errors import DBusError
from prometheus_client import start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from rdmad.bus.address import bus_address
from rdmad.bus.argtypes import add_bus_address, positive_seconds
from rdmad.bus.client import Client, Unreachable
from rdmad.bus.connection import BusConnection
from rdmad.bus.names import (
    CLAIM_IFACE,
    DEVICE_IFACE,
    MANAGER_IFACE,
    MANAGER_PATH,
    OBJECT_MANAGER_IFACE,
)
from rdmad.model import DeviceState

log = logging.getLogger("rdmad.exporter.main")

DEFAULT_LISTEN = ":9879"
EXIT_CANNOT_SERVE = 1  # 2: a usage error, from argparse
# How long a scrape waits for rdmad: well under Prometheus's default scrape_timeout (10 s), so
# that a hung rdmad reaches Prometheus as `rdmad_up 0` instead of a scrape it gave up on.
SCRAPE_TIMEOUT_S = 5.0
_NOT_IN_NAME = re.compile(r"[^a-zA-Z0-9_]")


RDMA_RESOURCES = ("hca_handle", "hca_object")  # the rdma cgroup controller's


class ReadFailed(Exception):
    """rdmad could not be read at all this scrape (down, not on the bus, timed out)."""


def metric_name(counter: str) -> str:
    """The kernel's counter name as a metric name: rdmad_port_<name> (+ _total on output)."""
    return "rdmad_port_" + _NOT_IN_NAME.sub("_", counter)


@dataclass(frozen=True)
class Snapshot:
    """One scrape's read of rdmad."""

    objects: dict[str, Any]  # GetManagedObjects: path -> interface -> property -> Variant
    counters: list[tuple[str, list[Any] | None]]  # device path, GetCounters (None: failed)
    stats: dict[str, Any]  # GetStatistics, values unwrapped
    # claim path, GetRdmaUsage, for each claim with a cgroup (None: failed)
    usage: list[tuple[str, list[Any] | None]]


class RdmadReader:
    """Reads rdmad over one D-Bus connection, made on first use and again after a failure."""

    def __init__(self, bus_address: str | None) -> None:
        self._address = bus_address
        self._bus: MessageBus | None = None

    async def _call(
        self, path: str, interface: str, member: str, signature: str = "", body: Sequence[Any] = ()
    ) -> list[Any]:
        if self._bus is None or not self._bus.connected:
            self._bus = await BusConnection(self._address).connect()
        return await Client(self._bus).call(member, signature, body, path=path, interface=interface)

    async def read(self) -> Snapshot:
        try:
            (objects,) = await self._call(MANAGER_PATH, OBJECT_MANAGER_IFACE, "GetManagedObjects")
            (stats,) = await self._call(MANAGER_PATH, MANAGER_IFACE, "GetStatistics")
        except (DBusError, Unreachable, OSError, EOFError) as e:
            self.close()
            raise ReadFailed(str(e)) from e
        devices = [p for p, ifaces in objects.items() if DEVICE_IFACE in ifaces]
        limited = [
            p
            for p, ifaces in objects.items()
            if CLAIM_IFACE in ifaces and _props(ifaces, CLAIM_IFACE).get("Cgroup")
        ]
        counters = [(p, await self._read_one(p, DEVICE_IFACE, "GetCounters")) for p in devices]
        usage = [(p, await self._read_one(p, CLAIM_IFACE, "GetRdmaUsage")) for p in limited]
        return Snapshot(objects, counters, {k: v.value for k, v in stats.items()}, usage)

    async def _read_one(self, path: str, interface: str, member: str) -> list[Any] | None:
        """One object's reply, None when the object went away mid-read (skipped this scrape)."""
        try:
            return await self._call(path, interface, member)
        except (Unreachable, OSError, EOFError) as e:  # rdmad went away mid-scrape
            self.close()
            raise ReadFailed(str(e)) from e
        except DBusError as e:  # e.g. NoSuchDevice: gone mid-read, skipped this scrape
            log.info("%s skipped this scrape: %s: %s", path, e.type, e.text)
            return None

    def close(self) -> None:
        if self._bus is not None:
            self._bus.disconnect()
            self._bus = None


def _props(ifaces: dict[str, Any], iface: str) -> dict[str, Any]:
    return {k: v.value for k, v in ifaces[iface].items()}


class RdmadCollector(Collector):
    def __init__(
        self,
        reader: RdmadReader,
        loop: asyncio.AbstractEventLoop,
        timeout: float = SCRAPE_TIMEOUT_S,
    ) -> None:
        self._reader = reader
        self._loop = loop
        self._timeout = timeout
        self._scrape_errors = 0  # devices skipped and failed reads, since the exporter started
        self._errors_lock = threading.Lock()  # scrapes run on concurrent server threads

    def _count_error(self) -> None:
        with self._errors_lock:
            self._scrape_errors += 1

    def _read(self) -> Snapshot:
        future = asyncio.run_coroutine_threadsafe(self._reader.read(), self._loop)
        try:
            return future.result(self._timeout)
        except concurrent.futures.TimeoutError as e:
            future.cancel()
            raise ReadFailed(f"rdmad did not answer within {self._timeout:g} s") from e

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("rdmad_up", "1 when rdmad answered this scrape, else 0")
        try:
            snap = self._read()
        except ReadFailed as e:
            log.info("rdmad unreachable: %s", e)
            self._count_error()
            up.add_metric([], 0)
            yield up
            yield self._errors_metric()
            return
        up.add_metric([], 1)
        yield up
        objects = snap.objects
        devices = {p: _props(i, DEVICE_IFACE) for p, i in objects.items() if DEVICE_IFACE in i}
        claims = [_props(i, CLAIM_IFACE) for i in objects.values() if CLAIM_IFACE in i]
        yield from self._device_metrics(devices)
        yield self._claim_info(claims, devices)
        yield from self._counter_metrics(devices, snap.counters)
        yield from self._usage_metrics(objects, snap.usage)
        yield from self._operation_metrics(snap.stats)
        yield self._errors_metric()

    def _errors_metric(self) -> Metric:
        m = CounterMetricFamily(
            "rdmad_exporter_scrape_errors",
            "Reads that failed during scrapes: rdmad unreachable, or a device gone mid-read "
            "(that device is left out of that scrape)",
        )
        m.add_metric([], self._scrape_errors)
        return m

    def _device_metrics(self, devices: dict[str, dict[str, Any]]) -> Iterator[Metric]:
        labels = ["device", "driver", "link_layer", "netdev", "pci_address", "numa_node"]
        info = GaugeMetricFamily(
            "rdmad_device_info",
            "An RDMA device rdmad knows (always 1)",
            labels=[*labels, "node_guid"],
        )
        state = GaugeMetricFamily(
            "rdmad_device_state",
            "1 for the device's current state (available, claimed, shared, unavailable)",
            labels=["device", "state"],
        )
        for d in devices.values():
            info.add_metric(
                [
                    d["Name"],
                    d["Driver"],
                    d["LinkLayer"],
                    d["NetDevice"],
                    d["PciAddress"],
                    str(d["NumaNode"]),
                    d["NodeGuid"],
                ],
                1,
            )
            for s in DeviceState:
                state.add_metric([d["Name"], str(s)], 1 if d["State"] == s else 0)
        yield info
        yield state

    def _claim_info(
        self, claims: list[dict[str, Any]], devices: dict[str, dict[str, Any]]
    ) -> Metric:
        netdev_of = {d["Name"]: d["NetDevice"] for d in devices.values()}
        m = GaugeMetricFamily(
            "rdmad_claim_info",
            "A live claim (always 1): join it on `device` to the port counters",
            labels=["claim", "device", "netdev", "netns", "interface", "owner", "shared"],
        )
        for c in claims:
            m.add_metric(
                [
                    c["Id"],
                    c["Device"],
                    netdev_of.get(c["Device"], ""),
                    c["Netns"],
                    c["InterfaceName"],
                    c["Owner"],
                    "true" if c["Shared"] else "false",
                ],
                1,
            )
        return m

    def _counter_metrics(
        self, devices: dict[str, dict[str, Any]], counters: list[tuple[str, list[Any] | None]]
    ) -> Iterator[Metric]:
        families: dict[str, CounterMetricFamily] = {}
        for path, reply in counters:
            if reply is None:
                self._count_error()
                continue
            _scope, ports = reply
            device = devices[path]["Name"]
            for port, values in ports:
                for counter, value in sorted(values.items()):
                    name = metric_name(counter)
                    family = families.get(name)
                    if family is None:
                        family = families[name] = CounterMetricFamily(
                            name,
                            f"The kernel's {counter} counter of an RDMA port",
                            labels=["device", "port"],
                        )
                    family.add_metric([device, str(port)], value)
        yield from families.values()

    def _usage_metrics(
        self, objects: dict[str, Any], usage: list[tuple[str, list[Any] | None]]
    ) -> Iterator[Metric]:
        labels = ["claim", "device", "cgroup", "resource"]
        current = GaugeMetricFamily(
            "rdmad_claim_rdma_current",
            "What the claim's cgroup uses of its device (rdma.current): hca_handle (user "
            "contexts), hca_object (verbs objects); join it on `claim` to rdmad_claim_info",
            labels=labels,
        )
        limit = GaugeMetricFamily(
            "rdmad_claim_rdma_max",
            "The limit in the claim's cgroup on its device (rdma.max); none for no limit",
            labels=labels,
        )
        for path, reply in usage:
            if reply is None:
                self._count_error()
                continue
            claim = _props(objects[path], CLAIM_IFACE)
            cgroup, used, most = reply
            for resource in RDMA_RESOURCES:
                at = [claim["Id"], claim["Device"], cgroup, resource]
                current.add_metric(at, used.get(resource, 0))
                if resource in most:
                    limit.add_metric(at, most[resource])
        yield current
        yield limit

    def _operation_metrics(self, stats: dict[str, Any]) -> Iterator[Metric]:
        claims = CounterMetricFamily("rdmad_claims", "Successful claims since rdmad started")
        claims.add_metric([], stats["claims"])
        yield claims
        releases = CounterMetricFamily(
            "rdmad_releases", "Ended claims by reason since rdmad started", labels=["reason"]
        )
        for reason, n in sorted(stats["releases"].items()):
            releases.add_metric([reason], n)
        yield releases
        errors = CounterMetricFamily(
            "rdmad_operation_errors",
            "Failed claim and release calls by D-Bus error name",
            labels=["operation", "error"],
        )
        for operation, error, n in stats["errors"]:
            errors.add_metric([operation, error], n)
        yield errors
        for key, name, what in (
            ("claim_latency", "rdmad_claim_duration_seconds", "Claim"),
            ("release_latency", "rdmad_release_duration_seconds", "Release"),
        ):
            buckets, total, _count = stats[key]
            yield HistogramMetricFamily(
                name,
                f"How long successful {what} calls took",
                buckets=[(_le(bound), n) for bound, n in buckets],
                sum_value=total,
            )


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def host_port(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen_address(text: str) -> tuple[str, int]:
    """HOST:PORT, :PORT or [V6]:PORT -> (host, port); an empty host is every address."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdecimal() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="rdmad-exporter",
        description="Serve rdmad's RDMA counters, devices, claims and operation statistics "
        "as Prometheus metrics at /metrics (read from rdmad over D-Bus at each scrape).",
    )
    p.add_argument(
        "--listen-address",
        type=listen_address,
        default=listen_address(DEFAULT_LISTEN),
        metavar="HOST:PORT",
        help=f"where to serve /metrics (default {DEFAULT_LISTEN}: every address; plain HTTP)",
    )
    add_bus_address(p)
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        default=SCRAPE_TIMEOUT_S,
        metavar="SECONDS",
        help=f"how long a scrape waits for rdmad before it answers rdmad_up 0 (default "
        f"{SCRAPE_TIMEOUT_S:g}; keep it under Prometheus's scrape_timeout)",
    )
    args = p.parse_args(argv)
    try:  # one that is not a D-Bus address would fail every scrape: refuse it now
        bus_address(args.bus_address)
    except ValueError as e:
        p.error(str(e))
    return args


async def serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    address = bus_address(args.bus_address)
    reader = RdmadReader(address)
    registry = CollectorRegistry()
    registry.register(RdmadCollector(reader, loop, args.timeout))
    host, port = args.listen_address
    server, _thread = start_http_server(port, host, registry=registry)
    log.info("serving /metrics on %s, reading rdmad on bus %s", host_port((host, port)), address)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        server.shutdown()
        reader.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    try:
        asyncio.run(serve(args))
    except OSError as e:  # the listen address is taken, not ours, or not a host
        where = host_port(args.listen_address)
        print(f"rdmad-exporter: cannot serve on {where}: {e.strerror or e}", file=sys.stderr)
        return EXIT_CANNOT_SERVE
    return 0


if __name__ == "__main__":
    sys.exit(main())
