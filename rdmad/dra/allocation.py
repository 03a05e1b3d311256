"""What a ResourceClaim asks of this node: its allocation's results for this driver, the pod
it is reserved for, and the driver's opaque parameters, read from the claim as the API
server serves it (resource.k8s.io/v1 JSON). Pure: rdmad/dra/prepare.py does the I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rdmad.dra.offer import is_slot
from rdmad.errors import InvalidArgs
from rdmad.model import DEFAULT_CHARDEVS
from rdmad.options import parse_claim_options

CONFIG_KIND = "RdmaConfig"
# The opaque parameters' keys: what each is, and the JSON type it must have.
PARAMETERS: dict[str, type] = {
    "apiVersion": str,
    "kind": str,
    "shared": bool,
    "interfaceName": str,
    "mtu": int,
    "chardevs": list,
    "hcaHandles": int,
    "hcaObjects": int,
}


class Refused(Exception):
    """One claim cannot be prepared (or unprepared): the text the kubelet shows in the
    pod's events, naming the claim and why."""


@dataclass(frozen=True)
class Params:
    """The driver's opaque parameters for one device, as validated."""

    shared: bool | None = None  # None: as allocated (a share slot, or the whole device)
    ifname: str = ""
    mtu: int = 0  # 0: the netdev's own
    chardevs: tuple[str, ...] = ()  # (): rdmad's default
    # the pod's RDMA limits on the device, in its cgroup's rdma.max (None: no limit)
    hca_handles: int | None = None
    hca_objects: int | None = None

    @property
    def limited(self) -> bool:
        return self.hca_handles is not None or self.hca_objects is not None


@dataclass(frozen=True)
class Wanted:
    """One device the claim's allocation gives this node."""

    request: str
    pool: str
    device: str  # its name in the ResourceSlice
    shared: bool  # a share slot: a shared hold (a macvlan child); else the whole device
    params: Params


@dataclass(frozen=True)
class Allocation:
    pod_uid: str
    devices: tuple[Wanted, ...]


def allocation_of(claim: Mapping[str, Any], uid: str, driver: str, node: str) -> Allocation:
    """The devices to hold for the claim `uid`, and for which pod; Refused if the claim is
    not this one, not allocated, allocated to another node, not reserved for one pod, or
    its parameters are invalid."""
    meta = claim.get("metadata") or {}
    where = f"ResourceClaim {meta.get('namespace', '')}/{meta.get('name', '')}"
    if meta.get("uid") != uid:
        raise Refused(
            f"{where} has UID {meta.get('uid')!r}, not {uid!r}: deleted and made again since"
        )
    status = claim.get("status") or {}
    allocation = status.get("allocation")
    if not allocation:
        raise Refused(f"{where} is not allocated")
    devices = allocation.get("devices") or {}
    results = [r for r in devices.get("results") or [] if r.get("driver") == driver]
    elsewhere = [r for r in results if r.get("pool") != node]
    if elsewhere:
        r = elsewhere[0]
        raise Refused(
            f"{where} is allocated to another node: device {r.get('device')!r} of pool "
            f"{r.get('pool')!r}, and this node is {node!r}"
        )
    pods = [p for p in status.get("reservedFor") or [] if p.get("resource") == "pods"]
    if not pods:
        raise Refused(f"{where} is reserved for no pod (status.reservedFor)")
    if len(pods) > 1:
        raise Refused(
            f"{where} is reserved for {len(pods)} pods; rdmad gives a device, or a share of "
            "it, to one pod's network namespace: give each pod its own claim (a "
            "ResourceClaimTemplate; share slots let several pods use one device)"
        )
    configs = [
        c for c in devices.get("config") or [] if (c.get("opaque") or {}).get("driver") == driver
    ]
    wanted = tuple(_wanted(where, r, _params(where, r["request"], configs)) for r in results)
    return Allocation(str(pods[0].get("uid", "")), wanted)


def _wanted(where: str, result: Mapping[str, Any], params: Params) -> Wanted:
    """The allocation says whole or shared; the parameter `shared`, if given, must agree,
    so that a claim never gets a kind of device it did not ask for."""
    shared = is_slot(result["device"])
    if params.shared is not None and params.shared != shared:
        got = "share slot" if shared else "whole device"
        raise Refused(
            f"{where}: request {result['request']!r} was allocated the {got} "
            f"{result['device']}, but its parameter 'shared' is {str(params.shared).lower()}: "
            "select share slots (attribute shared true) for a shared claim and whole "
            "devices (shared false) for a whole one, as the DeviceClasses in "
            "docs/kubernetes.md do"
        )
    return Wanted(result["request"], result["pool"], result["device"], shared, params)


def _params(where: str, request: str, configs: list[dict[str, Any]]) -> Params:
    """The parameters of the configs that apply to `request` (none named: all requests),
    in the API's order (the class's first, then the claim's): a later key wins."""
    merged: dict[str, Any] = {}
    parent = request.partition("/")[0]  # a firstAvailable subrequest: its request's config
    for config in configs:
        named = config.get("requests") or []
        if named and request not in named and parent not in named:
            continue
        parameters = config["opaque"].get("parameters")
        if not isinstance(parameters, dict):
            raise Refused(
                f"{where}: the {config.get('source', '')} config's parameters are not a JSON object"
            )
        merged.update(parameters)
    return parse_params(where, merged)


def parse_params(where: str, raw: Mapping[str, Any]) -> Params:
    """`raw`: the merged opaque parameters; Refused naming the claim and the fault."""
    for key, value in raw.items():
        want = PARAMETERS.get(key)
        if want is None:
            known = ", ".join(sorted(PARAMETERS))
            raise Refused(f"{where}: unknown parameter {key!r} (known: {known})")
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise Refused(f"{where}: parameter {key!r} must be a JSON {_json_type(want)}")
    if raw.get("kind", CONFIG_KIND) != CONFIG_KIND:
        raise Refused(f"{where}: parameters of kind {raw['kind']!r}, not {CONFIG_KIND!r}")
    chardevs = raw.get("chardevs")
    if chardevs is not None and not all(isinstance(c, str) for c in chardevs):
        raise Refused(f"{where}: parameter 'chardevs' must be a list of strings")
    params = Params(
        shared=raw.get("shared"),
        ifname=raw.get("interfaceName", ""),
        mtu=raw.get("mtu", 0),
        chardevs=tuple(chardevs or ()),
        hca_handles=raw.get("hcaHandles"),
        hca_objects=raw.get("hcaObjects"),
    )
    try:  # rdmad's own checks, so that a bad value is this claim's error before any Hold
        parse_claim_options(
            ifname=raw.get("interfaceName"),
            mtu=raw.get("mtu"),
            shared=bool(params.shared),
            chardevs=params.chardevs or DEFAULT_CHARDEVS,
            cgroup="pod" if params.limited else "",  # the pod's, found at prepare
            hca_handles=params.hca_handles,
            hca_objects=params.hca_objects,
        )
    except InvalidArgs as e:
        raise Refused(f"{where}: invalid parameters: {e}") from e
    return params


def _json_type(t: type) -> str:
    return {bool: "boolean", int: "integer", str: "string", list: "array"}[t]
