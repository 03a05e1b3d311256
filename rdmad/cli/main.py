"""rdmactl: a thin client of the io.rdmad1 D-Bus API (docs/dbus-api.md).

The global options (--json, --bus-address, --timeout) are accepted before and after the
subcommand. Output: aligned tables by default; with --json, the stable JSON shapes of
docs/dbus-api.md#rdmactl (stats: docs/metrics.md#rdmactl-stats). Exit statuses: the table in
rdmad/cli/exitcodes.py, which --help shows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TextIO

from dbus_fast import Message, MessageType, Variant
from dbus_fast.errors import DBusError

from rdmad import __version__
from rdmad.bus.address import bus_address
from rdmad.bus.argtypes import add_bus_address, positive_seconds
from rdmad.bus.client import Client, Unreachable
from rdmad.bus.connection import BusConnection
from rdmad.bus.names import (
    BUS_NAME,
    CLAIM_IFACE,
    DEVICE_IFACE,
    MANAGER_IFACE,
    MANAGER_PATH,
)
from rdmad.cli.exitcodes import Exit, help_text
from rdmad.cli.stats import check_stats_arguments, cmd_stats, stats_arguments
from rdmad.cli.table import table
from rdmad.model import ChardevKind
from rdmad.options import NETNS_MODES

HINT = "is rdmad running? systemctl status rdmad; or set --bus-address"
DEFAULT_TIMEOUT = 25.0  # seconds, as busctl's and libdbus's method calls

# Named arguments of the Manager's signals, for monitor output.
SIGNAL_ARGS: dict[str, tuple[str, ...]] = {
    "DeviceAdded": ("name", "path"),
    "DeviceRemoved": ("name", "path"),
    "Claimed": ("claim_id", "device", "path"),
    "Released": ("claim_id", "device", "reason"),
    "InterfacesAdded": ("path", "interfaces"),
    "InterfacesRemoved": ("path", "interfaces"),
}


# ---------------------------------------------------------------- pure formatting


def snake(name: str) -> str:
    """NodeGuid -> node_guid, CdiDevice -> cdi_device."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def plain(value: Any) -> Any:
    """Variants and tuples from dbus-fast → JSON-ready values."""
    if isinstance(value, Variant):
        return plain(value.value)
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def device_json(props: dict[str, Any], path: str) -> dict[str, Any]:
    out = {snake(k): plain(v) for k, v in props.items()}
    out["ports"] = [
        {"port": p[0], "state": p[1], "phys_state": p[2], "netdev": p[3]}
        for p in out.get("ports", [])
    ]
    out["path"] = path
    return out


def claim_json(props: dict[str, Any], path: str) -> dict[str, Any]:
    out = {snake(k): plain(v) for k, v in props.items()}
    out["char_devices"] = [
        {"path": c[0], "major": c[1], "minor": c[2]} for c in out.get("char_devices", [])
    ]
    if "gids" in out:
        keys = ("port", "index", "gid", "type", "netdev")
        out["gids"] = [dict(zip(keys, g, strict=True)) for g in out["gids"]]
    out["path"] = path
    return out


def devices_json(rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    keys = ("name", "state", "netdev", "path")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def claims_json(
    rows: Sequence[Sequence[Any]], props: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """ListClaims' rows, each with its claim's RouteTable (0: no policy routing) and
    PodCdiName ("": none) from the claim's properties."""
    keys = ("id", "device", "netns", "interface", "owner", "path")
    return [
        {
            **dict(zip(keys, row, strict=True)),
            "route_table": int(p["RouteTable"]),
            "pod_cdi_name": str(p["PodCdiName"]),
        }
        for row, p in zip(rows, props, strict=True)
    ]


def key_values(obj: dict[str, Any]) -> str:
    """`show`/`claim` human output: one "key: value" line per field, aligned."""
    width = max(len(k) for k in obj)
    lines = []
    for key, value in obj.items():
        if isinstance(value, list):
            value = ", ".join(
                " ".join(f"{k}={v}" for k, v in item.items())
                if isinstance(item, dict)
                else str(item)
                for item in value
            )
        elif isinstance(value, bool):
            value = "yes" if value else "no"
        lines.append(f"{key + ':':<{width + 1}} {value if value != '' else '-'}")
    return "\n".join(lines)


def claim_text(data: dict[str, Any]) -> str:
    """`claim`'s human output: its JSON's fields, with created_at as a local time."""
    shown = dict(data)
    if isinstance(shown.get("created_at"), int):
        when = datetime.fromtimestamp(shown["created_at"] / 1e6).astimezone()
        shown["created_at"] = when.isoformat(sep=" ", timespec="seconds")
    return key_values(shown)


def signal_json(msg: Message) -> dict[str, Any]:
    member = msg.member or ""
    if member == "PropertiesChanged":
        args: dict[str, Any] = {
            "interface": msg.body[0],
            "changed": {snake(k): plain(v) for k, v in msg.body[1].items()},
            "invalidated": list(msg.body[2]),
        }
    else:
        names = SIGNAL_ARGS.get(member, tuple(f"arg{i}" for i in range(len(msg.body))))
        args = dict(zip(names, (plain(b) for b in msg.body), strict=False))
    return {"signal": member, "path": msg.path, "args": args}


def signal_line(event: dict[str, Any]) -> str:
    args = event["args"]
    if event["signal"] == "PropertiesChanged":
        parts = [f"{k}={json.dumps(v)}" for k, v in args["changed"].items()]
        return f"{event['path']}: {' '.join(parts)}"
    parts = [f"{k}={v}" for k, v in args.items() if not isinstance(v, dict | list)]
    return f"{event['signal']} {' '.join(parts)}"


def error_line(name: str, text: str) -> str:
    return f"rdmactl: {name.rsplit('.', 1)[-1]}: {text}"


async def cmd_status(c: Client, a: argparse.Namespace, out: TextIO) -> None:
    props = await c.get_all(MANAGER_PATH, MANAGER_IFACE)
    (devices,) = await c.call("ListDevices")
    (claims,) = await c.call("ListClaims")
    data = {
        "version": props["Version"],
        "netns_mode": props["NetnsMode"],
        "devices": len(devices),
        "claims": len(claims),
    }
    _emit(out, a, data, key_values(data))


async def cmd_list(c: Client, a: argparse.Namespace, out: TextIO) -> None:
    (rows,) = await c.call("ListDevices")
    _emit(out, a, devices_json(rows), table(("DEVICE", "STATE", "NETDEV"), [r[:3] for r in rows]))


async def cmd_claims(c: Client, a: argparse.Namespace, out: TextIO) -> None:
    (rows,) = await c.call("ListClaims")
    props = await asyncio.gather(*(c.get_all(r[5], CLAIM_IFACE) for r in rows))
    data = claims_json(rows, props)
    shown = [
        (*r[:5], d["route_table"] or "-", d["pod_cdi_name"])
        for r, d in zip(rows, data, strict=True)
    ]
    _emit(
        out,
        a,
        data,
        table(("CLAIM", "DEVICE", "NETNS", "INTERFACE", "OWNER", "TABLE", "POD-CDI"), shown),
    )


async def cmd_show(c: Client, a: argparse.Namespace, out: TextIO) -> None:
    (path,) = await c.call("GetDevice", "s", [a.device])
    data = device_json(await c.get_all(path, DEVICE_IFACE), path)
    _emit(out, a, data, key_values(data))


async def cmd_claim(c: Client, a: argparse.Namespace, out: TextIO) -> None:
    opts: dict[str, Variant] = {}
    if a.ifname is not None:
        opts["ifname"] = Variant("s", a.ifname)
    if a.mtu is not None:
        opts["mtu"] = Variant("u", a.mtu)
    if a.address:
        opts["addresses"] = Variant("as", a.address)
    if a.shared:
        opts["shared"] = Variant("b", True)
    if a.chardev:
        opts["chardevs"] = Variant("as", a.chardev)
    if a.owner is not None:
        opts["owner"] = Variant("s", a.owner)
    if a.no_netdev:
        opts["netdev"] = Variant("b", False)
    if a.table is not None:
        opts["table"] = Variant("u", a.table)
    if a.route:
        opts["routes"] = Variant("as", a.route)
    if a.pod_cdi_name is not None:
        opts["pod_cdi_name"] = Variant("s", a.pod_cdi_name)
    if a.cgroup is not None:
        opts["cgroup"] = Variant("s", a.cgroup)
    for name, value in (("hca_handles", a.hca_handles), ("hca_objects", a.hca_objects)):
        if value is not None:
            opts[name] = Variant("u", value)
    (path,) = await c.call("Claim", "ssa{sv}", [a.device, a.netns, opts])
    data = claim_json(await c.get_all(path, CLAIM_IFACE), path)
    _emit(out, a, data, claim_text(data))


async def cmd_release(c: Client, a: argparse.Namespace, out: TextIO) -> None:
    await c.call("Release", "s", [a.claim])
    _emit(out, a, {"released": a.claim}, f"released {a.claim}")


async def cmd_mode(c: Client, a: argparse.Namespace, out: TextIO) -> None:
    if a.mode is not None:
        await c.call("SetNetnsMode", "s", [a.mode])
    props = await c.get_all(MANAGER_PATH, MANAGER_IFACE)
    _emit(out, a, {"netns_mode": props["NetnsMode"]}, props["NetnsMode"])


async def cmd_monitor(c: Client, a: argparse.Namespace, out: TextIO) -> None:
    await c.add_match(f"type='signal',sender='{BUS_NAME}',path_namespace='{MANAGER_PATH}'")

    def on_message(msg: Message) -> None:
        if msg.message_type is not MessageType.SIGNAL or not (msg.path or "").startswith(
            MANAGER_PATH
        ):
            return
        event = signal_json(msg)
        try:
            print(json.dumps(event) if a.json else signal_line(event), file=out, flush=True)
        except OSError as exc:  # our reader left (rdmactl monitor | head -1), a full disk: stop
            output_failed.append(exc)
            c.bus.disconnect()

    output_failed: list[OSError] = []
    c.bus.add_message_handler(on_message)
    # A BusConnection: returns when the bus went away (dbus restarted) or we left.
    await c.bus.wait_for_disconnect()  # type: ignore[no-untyped-call]
    if output_failed:
        raise output_failed[0]
    raise Unreachable("the bus closed the connection")


def _emit(out: TextIO, a: argparse.Namespace, data: Any, human: str) -> None:
    print(json.dumps(data) if a.json else human, file=out)


# ---------------------------------------------------------------- command line

Handler = Callable[[Client, argparse.Namespace, TextIO], Awaitable[None]]


def _no_arguments(p: argparse.ArgumentParser) -> None:
    pass


def _no_check(args: argparse.Namespace) -> str | None:
    return None


@dataclass(frozen=True)
class Command:
    """One subcommand: its handler, a one-line help, what it adds to its parser, and a check
    of what argparse cannot see alone (the usage error it returns, or None)."""

    handler: Handler
    help: str
    arguments: Callable[[argparse.ArgumentParser], None] = _no_arguments
    description: str = ""
    check: Callable[[argparse.Namespace], str | None] = _no_check


def _uint32(text: str) -> int:
    value = int(text)  # argparse turns ValueError into "invalid _uint32 value"
    if not 0 <= value <= 0xFFFFFFFF:
        raise argparse.ArgumentTypeError(f"{text} is not an unsigned 32-bit number")
    return value


def _route_table(text: str) -> int:
    """`auto` is 0, the table option's "rdmad picks"."""
    return 0 if text == "auto" else _uint32(text)


def _netns(text: str) -> str:
    """A relative path (it has a '/') is made absolute against the caller's directory, as
    rdmad's own is not the caller's; a name under /run/netns and pid:PID pass as typed."""
    if text.startswith("pid:") or "/" not in text or os.path.isabs(text):
        return text
    return os.path.abspath(text)


def _show_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("device", help="RDMA device name, such as mlx5_0")


def _claim_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("device", help="RDMA device name, such as mlx5_0")
    p.add_argument(
        "netns",
        type=_netns,
        help="/run/netns/NAME, /proc/PID/ns/net, NAME (under /run/netns), pid:PID, or a "
        "path relative to the current directory, such as ./pod1",
    )
    p.add_argument(
        "--ifname",
        help="netdev name inside the netns (default: the host name; net1 with --shared)",
    )
    p.add_argument("--mtu", type=_uint32, help="MTU inside the netns (68-65535)")
    p.add_argument(
        "--address",
        action="append",
        default=[],
        metavar="CIDR",
        help="address to add inside the netns, such as 10.0.0.5/24 (repeatable)",
    )
    p.add_argument(
        "--shared",
        action="store_true",
        help="a macvlan child of the device's netdev instead of the whole device "
        "(shared netns mode)",
    )
    p.add_argument(
        "--chardev",
        action="append",
        default=[],
        choices=[k.value for k in ChardevKind],
        help="char device to hand out (repeatable; default: uverbs and rdma_cm)",
    )
    p.add_argument("--owner", help="free label, such as a container id (at most 256 bytes)")
    p.add_argument(
        "--no-netdev",
        action="store_true",
        help="move only the RDMA device, not its netdev (exclusive netns mode)",
    )
    p.add_argument(
        "--table",
        type=_route_table,
        metavar="N|auto",
        help="policy routing: a rule from each --address to routing table N in the netns, "
        "with the connected routes there (auto: rdmad picks one, from 1000 by default)",
    )
    p.add_argument(
        "--route",
        action="append",
        default=[],
        metavar="DST[,via=GW]",
        help="a route in the claim's --table, such as 0.0.0.0/0,via=10.0.0.1 (repeatable)",
    )
    p.add_argument(
        "--pod-cdi-name",
        metavar="NAME",
        help="a CDI device name for every RDMA device of the netns: "
        "rdmad.io/rdma=NAME injects them all",
    )
    _limit_arguments(p)


def _limit_arguments(p: argparse.ArgumentParser) -> None:
    """A claim's RDMA limits (docs/dbus-api.md#rdma-limits-the-rdma-cgroup)."""
    p.add_argument(
        "--cgroup",
        metavar="PATH",
        help="a cgroup v2 directory (relative to /sys/fs/cgroup, or absolute under it) "
        "whose rdma.max gets the --hca-* limits on the device",
    )
    p.add_argument(
        "--hca-handles",
        type=_uint32,
        metavar="N",
        help="at most N user contexts (ibv_open_device) on the device in --cgroup",
    )
    p.add_argument(
        "--hca-objects",
        type=_uint32,
        metavar="N",
        help="at most N verbs objects (PD, MR, CQ, QP, ...) on the device in --cgroup",
    )


def _release_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("claim", help="claim id, as `rdmactl claims` lists it")


def _mode_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "mode",
        nargs="?",
        choices=NETNS_MODES,
        help="set this mode (only while no other netns exists); without it, show the mode",
    )


# To add a subcommand: write its handler (and an arguments function if it takes any), then
# add one entry here. The global options come with every subcommand.
COMMANDS: dict[str, Command] = {
    "status": Command(cmd_status, "daemon version, netns mode, device and claim counts"),
    "list": Command(cmd_list, "list RDMA devices: name, state, netdev"),
    "claims": Command(cmd_claims, "list live claims: id, device, netns, interface, owner"),
    "show": Command(cmd_show, "show every property of one device", _show_arguments),
    "claim": Command(
        cmd_claim,
        "claim a device for a network namespace (root, or as polkit allows)",
        _claim_arguments,
        "Give DEVICE (or, with --shared, a macvlan child of its netdev) to the network "
        "namespace NETNS, and print the claim. The claim lasts until `rdmactl release` or "
        "until the namespace dies.",
    ),
    "release": Command(
        cmd_release,
        "release a claim and restore the host side (root, or as polkit allows)",
        _release_arguments,
    ),
    "mode": Command(
        cmd_mode,
        "show or set the kernel's RDMA netns mode (setting: root, or as polkit allows)",
        _mode_arguments,
    ),
    "stats": Command(
        cmd_stats,
        "counters of every device and claim (or one), read from the kernel now",
        stats_arguments,
        "Print each port's counters of DEVICE or CLAIM (default: every device and claim, "
        "and rdmad's own claim/release/error counts). Scope 'device' counts everything on "
        "the device (a shared claim shares it); 'claim' counts a whole-device claim's own "
        "traffic. --watch refreshes in place with per-second rates, like top.",
        check_stats_arguments,
    ),
    "monitor": Command(
        cmd_monitor,
        "print rdmad's signals as they happen, until Ctrl-C",
        description="Print one line per signal (one JSON object per line with --json): "
        "DeviceAdded, DeviceRemoved, Claimed, Released, PropertiesChanged and the "
        "ObjectManager's InterfacesAdded/InterfacesRemoved.",
    ),
}

EPILOG = f"""\
global options (--json, --bus-address, --timeout) may come before or after the command.
{help_text()}
API reference: docs/dbus-api.md in rdmad's source."""


def add_global_options(p: argparse.ArgumentParser, *, in_subcommand: bool) -> None:
    """The options every command takes, accepted before and after the subcommand.

    argparse copies every attribute of the subcommand's namespace over the main one, so the
    subcommand's copies default to SUPPRESS: a value given before the subcommand survives
    unless the same option is given again after it."""
    default: dict[str, Any] = {"default": argparse.SUPPRESS} if in_subcommand else {}
    group = p.add_argument_group("global options")
    add_bus_address(group, **default)
    group.add_argument(
        "--json", action="store_true", help="print stable JSON instead of text", **default
    )
    group.add_argument(
        "--timeout",
        type=positive_seconds,
        metavar="SECONDS",
        help=f"give up on rdmad when a call has no answer by then (default {DEFAULT_TIMEOUT:g})",
        **(default or {"default": DEFAULT_TIMEOUT}),
    )


def build_parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """rdmactl's parser, and each subcommand's."""
    p = argparse.ArgumentParser(
        prog="rdmactl",
        description="Claim RDMA devices for network namespaces through rdmad (D-Bus io.rdmad1).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"rdmactl {__version__}")
    add_global_options(p, in_subcommand=False)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    subparsers = {}
    for name, command in COMMANDS.items():
        cp = subparsers[name] = sub.add_parser(
            name, help=command.help, description=command.description or command.help
        )
        command.arguments(cp)
        add_global_options(cp, in_subcommand=True)
    return p, subparsers


def build_parser() -> argparse.ArgumentParser:
    return build_parsers()[0]


async def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run the command, writing to `out` (default: stdout as it is now)."""
    try:
        async with asyncio.timeout(args.timeout):
            bus = await BusConnection(bus_address(args.bus_address)).connect()
    except TimeoutError:
        raise Unreachable(f"cannot connect: no answer within {args.timeout:g} s") from None
    except OSError as exc:
        raise Unreachable(f"cannot connect: {exc.strerror or exc}") from exc
    except ValueError as exc:  # what answered the handshake is no D-Bus daemon
        raise Unreachable(f"cannot connect: {exc}") from exc
    try:
        handler = COMMANDS[args.command].handler
        await handler(Client(bus, args.timeout), args, out or sys.stdout)
    finally:
        bus.disconnect()
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line; exits 2 with a usage message on bad input."""
    parser, subparsers = build_parsers()
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse would blame rdmactl and show its usage; the subcommand's is the help
        subparsers[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    problem = COMMANDS[args.command].check(args)
    if problem is not None:
        subparsers[args.command].error(problem)
    for key, value in vars(args).items():
        for item in value if isinstance(value, list) else [value]:
            try:
                if isinstance(item, str):
                    item.encode("utf-8")
            except UnicodeEncodeError:  # bytes from argv that are not UTF-8: D-Bus has no way
                parser.error(f"argument {key}: {item!r} is not valid UTF-8")
    try:
        bus_address(args.bus_address)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        code = asyncio.run(run(args))
        sys.stdout.flush()  # a reader gone or a full disk shows here, not at Python's exit
        return code
    except KeyboardInterrupt:
        # monitor and stats --watch end this way
        ends = args.command == "monitor" or getattr(args, "watch", False)
        return Exit.OK if ends else Exit.INTERRUPTED
    except Unreachable as exc:
        where = bus_address(args.bus_address)
        print(f"rdmactl: daemon unreachable: bus {where}: {exc} (hint: {HINT})", file=sys.stderr)
        return Exit.UNREACHABLE
    except DBusError as exc:
        print(error_line(exc.type, exc.text), file=sys.stderr)
        return Exit.REFUSED
    except BrokenPipeError:
        # Whoever read our output has gone: say nothing more, and keep Python's exit-time
        # flush of stdout from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return Exit.BROKEN_PIPE
    except OSError as exc:  # the bus's are Unreachable by now: stdout failed (a full disk)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"rdmactl: cannot write the output: {exc.strerror or exc}", file=sys.stderr)
        return Exit.OUTPUT


if __name__ == "__main__":
    sys.exit(main())
