"""The plugin's input: CNI_* environment variables and the network config on stdin,
decoded and checked before anything is touched (errors 4, 6, 7 and 1)."""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from rdmad.cni.spec import (
    DECODE_FAILURE,
    INCOMPATIBLE_VERSION,
    INVALID_CONFIG,
    INVALID_ENV,
    SUPPORTED_VERSIONS,
    CniError,
)

VERBS = ("ADD", "DEL", "CHECK", "VERSION", "STATUS", "GC")
# The spec's rules: a network name and a container id are alphanumerics plus "_.-".
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
# What the kernel accepts as a netdev name (as rdmad.options checks it).
_IFNAME = re.compile(r"^[^/:\s\x00]{1,15}$")
_PCI = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
SELECTOR_KEYS = ("driver", "linkLayer", "netdev", "numaNode", "pciAddress")
CHARDEV_KINDS = ("uverbs", "rdma_cm", "umad", "issm")
OWNER_PREFIX = "cni"
OWNER_MAX_BYTES = 256  # rdmad's limit on a claim's owner


class Env(NamedTuple):
    command: str
    container_id: str
    netns: str
    ifname: str
    args: dict[str, str]
    path: tuple[str, ...]


class Selector(NamedTuple):
    driver: str = ""
    link_layer: str = ""
    netdev: str = ""
    numa_node: int | None = None
    pci_address: str = ""  # a prefix: "0000:3b:" matches every function on that bus


class NetConf(NamedTuple):
    version: str
    name: str
    raw: bytes  # as read: handed unchanged to the IPAM plugin
    device: str = ""
    device_id: str = ""
    selector: Selector | None = None
    shared: bool = False
    mtu: int | None = None
    chardevs: tuple[str, ...] = ()
    netdev: bool = True
    bus_address: str = ""
    ipam_type: str = ""
    prev_result: dict[str, Any] | None = None
    mac: str = ""
    device_info_file: str = ""
    valid_attachments: tuple[tuple[str, str], ...] = ()  # GC: (container id, ifname)


def attachment_owner(network: str, container_id: str, ifname: str) -> str:
    """The claim's owner label: the attachment it belongs to, as the spec identifies it.
    "/" separates the parts: none of the three may contain one."""
    return f"{OWNER_PREFIX}/{network}/{container_id}/{ifname}"


def parse_owner(owner: str) -> tuple[str, str, str] | None:
    """(network, container id, ifname) of a claim made by this plugin, else None."""
    parts = owner.split("/")
    if len(parts) != 4 or parts[0] != OWNER_PREFIX:
        return None
    return parts[1], parts[2], parts[3]


def parse_env(environ: dict[str, str]) -> Env:
    command = environ.get("CNI_COMMAND", "")
    if command not in VERBS:
        raise CniError(INVALID_ENV, f"CNI_COMMAND {command!r} is not one of {', '.join(VERBS)}")
    if command in ("VERSION", "STATUS", "GC"):
        return Env(command, "", "", "", {}, _cni_path(environ))
    container_id = environ.get("CNI_CONTAINERID", "")
    if not _NAME.match(container_id):
        raise CniError(INVALID_ENV, f"CNI_CONTAINERID {container_id!r} is missing or invalid")
    ifname = environ.get("CNI_IFNAME", "")
    if not _IFNAME.match(ifname) or ifname in (".", ".."):
        raise CniError(INVALID_ENV, f"CNI_IFNAME {ifname!r} is missing or not a valid name")
    netns = environ.get("CNI_NETNS", "")
    if command != "DEL" and not netns:
        raise CniError(INVALID_ENV, f"CNI_NETNS is required for {command}")
    return Env(command, container_id, netns, ifname, _cni_args(environ), _cni_path(environ))


def _cni_path(environ: dict[str, str]) -> tuple[str, ...]:
    return tuple(p for p in environ.get("CNI_PATH", "").split(":") if p)


def _cni_args(environ: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in environ.get("CNI_ARGS", "").split(";"):
        if not pair:
            continue
        key, sep, value = pair.partition("=")
        if not sep:
            raise CniError(INVALID_ENV, f"CNI_ARGS: {pair!r} is not KEY=VALUE")
        out[key] = value
    return out


def decode(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CniError(DECODE_FAILURE, "the network configuration is not JSON", str(exc)) from None
    if not isinstance(doc, dict):
        raise CniError(DECODE_FAILURE, "the network configuration is not a JSON object")
    return doc


def parse_netconf(raw: bytes, command: str) -> NetConf:
    doc = decode(raw)
    version = doc.get("cniVersion")
    if not isinstance(version, str):
        raise CniError(INVALID_CONFIG, "cniVersion is missing")
    if version not in SUPPORTED_VERSIONS:
        raise CniError(
            INCOMPATIBLE_VERSION,
            f"cniVersion {version} is not supported",
            f"supported: {', '.join(SUPPORTED_VERSIONS)}",
        )
    name = _get(doc, "name", str, "")
    if not _NAME.match(name):
        raise CniError(INVALID_CONFIG, f"name {name!r} is missing or invalid")
    runtime = _get(doc, "runtimeConfig", dict, {})
    device = _get(doc, "device", str, "")
    device_id = _get(doc, "deviceID", str, "") or _get(runtime, "deviceID", str, "")
    selector = _selector(doc.get("selector"))
    given = [k for k, v in (("device", device), ("deviceID", device_id)) if v]
    given += ["selector"] if selector is not None else []
    if command in ("ADD", "CHECK") and len(given) != 1:
        raise CniError(
            INVALID_CONFIG,
            "exactly one of device, deviceID and selector must name the device"
            + (f" (got {', '.join(given)})" if given else ""),
        )
    if device_id and not _PCI.match(device_id):
        raise CniError(INVALID_CONFIG, f"deviceID {device_id!r} is not a PCI address")
    mtu = doc.get("mtu")
    if mtu is not None and (type(mtu) is not int or not 68 <= mtu <= 65535):
        raise CniError(INVALID_CONFIG, f"mtu {mtu!r} is not an integer in 68-65535")
    chardevs = _get(doc, "chardevs", list, [])
    for kind in chardevs:
        if kind not in CHARDEV_KINDS:
            raise CniError(
                INVALID_CONFIG, f"chardevs: {kind!r} is not one of {', '.join(CHARDEV_KINDS)}"
            )
    shared = _get(doc, "shared", bool, False)
    netdev = _get(doc, "netdev", bool, True)
    if shared and not netdev:
        raise CniError(INVALID_CONFIG, "netdev=false applies to whole-device claims only")
    ipam = _get(doc, "ipam", dict, {})
    ipam_type = _get(ipam, "type", str, "") if ipam else ""
    if ipam and not _NAME.match(ipam_type):
        raise CniError(INVALID_CONFIG, "ipam.type is missing or invalid")
    if ipam_type and not netdev:
        raise CniError(INVALID_CONFIG, "ipam needs a netdev in the container (netdev=false)")
    mac = _get(runtime, "mac", str, "")
    if mac and not shared:
        raise CniError(
            INVALID_CONFIG,
            "the mac capability applies to shared claims only: a whole device keeps its own MAC",
        )
    prev = doc.get("prevResult")
    if prev is not None and not isinstance(prev, dict):
        raise CniError(INVALID_CONFIG, "prevResult is not an object")
    return NetConf(
        version=version,
        name=name,
        raw=raw,
        device=device,
        device_id=device_id,
        selector=selector,
        shared=shared,
        mtu=mtu,
        chardevs=tuple(chardevs),
        netdev=netdev,
        bus_address=_get(doc, "busAddress", str, ""),
        ipam_type=ipam_type,
        prev_result=prev,
        mac=mac,
        device_info_file=_get(doc, "CNIDeviceInfoFile", str, "")
        or _get(runtime, "CNIDeviceInfoFile", str, ""),
        valid_attachments=_valid_attachments(doc) if command == "GC" else (),
    )


def _get(doc: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = doc.get(key, default)
    if value is None:
        return default
    if type(value) is not kind:
        raise CniError(INVALID_CONFIG, f"{key} must be a JSON {_json_kind(kind)}")
    return value


def _json_kind(kind: type) -> str:
    return {str: "string", bool: "boolean", list: "array", dict: "object"}[kind]


def _selector(value: object) -> Selector | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not value:
        raise CniError(INVALID_CONFIG, "selector must be a non-empty object")
    unknown = sorted(set(value) - set(SELECTOR_KEYS))
    if unknown:
        raise CniError(
            INVALID_CONFIG,
            f"selector: unknown key {unknown[0]!r} (known: {', '.join(SELECTOR_KEYS)})",
        )
    numa = value.get("numaNode")
    if numa is not None and type(numa) is not int:
        raise CniError(INVALID_CONFIG, "selector.numaNode must be an integer")
    texts = {k: value.get(k, "") for k in ("driver", "linkLayer", "netdev", "pciAddress")}
    for key, text in texts.items():
        if not isinstance(text, str):
            raise CniError(INVALID_CONFIG, f"selector.{key} must be a string")
    return Selector(texts["driver"], texts["linkLayer"], texts["netdev"], numa, texts["pciAddress"])


def _valid_attachments(doc: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    listed = doc.get("cni.dev/valid-attachments", [])
    if not isinstance(listed, list):
        raise CniError(INVALID_CONFIG, "cni.dev/valid-attachments must be an array")
    out = []
    for item in listed:
        if not isinstance(item, dict) or not isinstance(item.get("containerID"), str):
            raise CniError(INVALID_CONFIG, "cni.dev/valid-attachments: entries need containerID")
        out.append((item["containerID"], str(item.get("ifname", ""))))
    return tuple(out)
