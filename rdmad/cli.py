"""rdmactl: a thin client of the io.rdmad1 D-Bus API.

Output: aligned tables by default; with --json, stable JSON on stdout:
  list     [{"name", "state", "netdev", "path"}]
  claims   [{"id", "device", "netns", "interface", "owner", "path"}]
  show     {every Device property in snake_case (name, index, node_guid, driver,
            link_layer, ports: [{"port", "state", "phys_state", "netdev"}], net_device,
            pci_address, numa_node, char_devices, state, netns, claims), "path"}
  claim    {every Claim property in snake_case (id, device, netns, netns_path,
            interface_name, shared, owner, char_devices: [{"path", "major", "minor"}],
            cdi_device, created_at), "path"}
  status   {"version", "netns_mode", "devices", "claims"}
  mode     {"netns_mode"}
  release  {"released": ID}
  monitor  one object per line: {"signal", "path", "args": {...}}; for PropertiesChanged
           "args" is {"interface", "changed": {snake_case: value}, "invalidated": [...]}
Exit codes: 0 ok, 1 the daemon said no (one line on stderr), 2 usage, 3 daemon unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from dbus_fast import BusType, Message, MessageType, Variant
from dbus_fast.aio import MessageBus
from dbus_fast.errors import DBusError

from rdmad.bus.names import (
    BUS_NAME,
    CLAIM_IFACE,
    DEVICE_IFACE,
    MANAGER_IFACE,
    MANAGER_PATH,
    PROPERTIES_IFACE,
)

EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE = 1, 2, 3
UNREACHABLE_ERRORS = {
    "org.freedesktop.DBus.Error.ServiceUnknown",
    "org.freedesktop.DBus.Error.NameHasNoOwner",
    "org.freedesktop.DBus.Error.NoReply",
    "org.freedesktop.DBus.Error.Disconnected",
}
HINT = "is rdmad running? (systemctl status rdmad; or set --bus-address)"

# Named arguments of the Manager's signals, for monitor output.
SIGNAL_ARGS: dict[str, tuple[str, ...]] = {
    "DeviceAdded": ("name", "path"),
    "DeviceRemoved": ("name", "path"),
    "Claimed": ("claim_id", "device", "path"),
    "Released": ("claim_id", "device", "reason"),
    "InterfacesAdded": ("path", "interfaces"),
    "InterfacesRemoved": ("path", "interfaces"),
}


class Unreachable(Exception):
    pass


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
    out["path"] = path
    return out


def devices_json(rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    keys = ("name", "state", "netdev", "path")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def claims_json(rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    keys = ("id", "device", "netns", "interface", "owner", "path")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces; "-" for empty cells."""
    cells = [[str(c) if str(c) != "" else "-" for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = [headers, *cells]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


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


# ---------------------------------------------------------------- bus client


class Client:
    def __init__(self, bus: MessageBus) -> None:
        self.bus = bus

    async def call(
        self,
        member: str,
        signature: str = "",
        body: Sequence[Any] = (),
        *,
        path: str = MANAGER_PATH,
        interface: str = MANAGER_IFACE,
        fds: Sequence[int] = (),
    ) -> list[Any]:
        reply = await self.bus.call(
            Message(
                destination=BUS_NAME,
                path=path,
                interface=interface,
                member=member,
                signature=signature,
                body=list(body),
                unix_fds=list(fds),
            )
        )
        if reply is None:
            raise Unreachable("no reply")
        if reply.message_type is MessageType.ERROR:
            name = reply.error_name or "org.freedesktop.DBus.Error.Failed"
            text = reply.body[0] if reply.body else name
            if name in UNREACHABLE_ERRORS:
                raise Unreachable(text)
            raise DBusError(name, text)
        return list(reply.body)

    async def get_all(self, path: str, interface: str) -> dict[str, Any]:
        (props,) = await self.call(
            "GetAll", "s", [interface], path=path, interface=PROPERTIES_IFACE
        )
        return {k: v.value for k, v in props.items()}


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
    _emit(
        out,
        a,
        claims_json(rows),
        table(("CLAIM", "DEVICE", "NETNS", "INTERFACE", "OWNER"), [r[:5] for r in rows]),
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
    (path,) = await c.call("Claim", "ssa{sv}", [a.device, a.netns, opts])
    data = claim_json(await c.get_all(path, CLAIM_IFACE), path)
    _emit(out, a, data, key_values(data))


async def cmd_release(c: Client, a: argparse.Namespace, out: TextIO) -> None:
    await c.call("Release", "s", [a.claim])
    if a.json:
        print(json.dumps({"released": a.claim}), file=out)


async def cmd_mode(c: Client, a: argparse.Namespace, out: TextIO) -> None:
    if a.mode is not None:
        await c.call("SetNetnsMode", "s", [a.mode])
    props = await c.get_all(MANAGER_PATH, MANAGER_IFACE)
    _emit(out, a, {"netns_mode": props["NetnsMode"]}, props["NetnsMode"])


async def cmd_monitor(c: Client, a: argparse.Namespace, out: TextIO) -> None:
    rule = f"type='signal',sender='{BUS_NAME}',path_namespace='{MANAGER_PATH}'"
    reply = await c.bus.call(
        Message(
            destination="org.freedesktop.DBus",
            path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus",
            member="AddMatch",
            signature="s",
            body=[rule],
        )
    )
    if reply is None or reply.message_type is MessageType.ERROR:
        raise DBusError("org.freedesktop.DBus.Error.Failed", "cannot subscribe to signals")

    def on_message(msg: Message) -> None:
        if msg.message_type is not MessageType.SIGNAL or not (msg.path or "").startswith(
            MANAGER_PATH
        ):
            return
        event = signal_json(msg)
        print(json.dumps(event) if a.json else signal_line(event), file=out, flush=True)

    c.bus.add_message_handler(on_message)
    await c.bus.wait_for_disconnect()  # type: ignore[no-untyped-call]  # unannotated upstream
    raise Unreachable("the bus connection closed")


def _emit(out: TextIO, a: argparse.Namespace, data: Any, human: str) -> None:
    print(json.dumps(data) if a.json else human, file=out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rdmactl", description="Claim RDMA devices via rdmad.")
    p.add_argument(
        "--bus-address", help="D-Bus address (default: $DBUS_SYSTEM_BUS_ADDRESS or the system bus)"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="daemon version, netns mode, counts")
    sub.add_parser("list", help="list RDMA devices")
    sub.add_parser("claims", help="list live claims")
    show = sub.add_parser("show", help="show one device")
    show.add_argument("device")
    claim = sub.add_parser("claim", help="claim a device for a netns")
    claim.add_argument("device")
    claim.add_argument("netns", help="/run/netns/NAME, /proc/PID/ns/net, NAME or pid:PID")
    claim.add_argument("--ifname")
    claim.add_argument("--mtu", type=int)
    claim.add_argument("--address", action="append", default=[], help="CIDR (repeatable)")
    claim.add_argument("--shared", action="store_true")
    claim.add_argument(
        "--chardev", action="append", default=[], choices=["uverbs", "rdma_cm", "umad", "issm"]
    )
    claim.add_argument("--owner")
    claim.add_argument(
        "--no-netdev", action="store_true", help="move only the RDMA device, not its netdev"
    )
    release = sub.add_parser("release", help="release a claim")
    release.add_argument("claim")
    mode = sub.add_parser("mode", help="show or set the RDMA netns mode")
    mode.add_argument("mode", nargs="?", choices=["shared", "exclusive"])
    sub.add_parser("monitor", help="print signals until Ctrl-C")
    return p


COMMANDS = {
    "status": cmd_status,
    "list": cmd_list,
    "claims": cmd_claims,
    "show": cmd_show,
    "claim": cmd_claim,
    "release": cmd_release,
    "mode": cmd_mode,
    "monitor": cmd_monitor,
}


async def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    address = args.bus_address or os.environ.get("DBUS_SYSTEM_BUS_ADDRESS") or None
    try:
        bus = await MessageBus(bus_address=address, bus_type=BusType.SYSTEM).connect()
    except (OSError, ValueError) as exc:
        raise Unreachable(f"cannot connect to the bus: {exc}") from exc
    try:
        await COMMANDS[args.command](Client(bus), args, out)
    finally:
        bus.disconnect()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # exits 2 on usage errors
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        return 0
    except Unreachable as exc:
        print(f"rdmactl: daemon unreachable: {exc}\nhint: {HINT}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except DBusError as exc:
        print(error_line(exc.type, exc.text), file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
