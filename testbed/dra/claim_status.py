"""The status subresource of a ResourceClaim as the API server serves a driver's
server-side apply of it (PATCH .../resourceclaims/NAME/status, application/apply-patch+yaml),
for testbed/dra/apiserver.py.

What the real one does, as far as a driver's `status.devices` goes (kubernetes
pkg/registry/resource/resourceclaim's status strategy and its validation, and
DRAResourceClaimGranularStatusAuthorization, beta and on since 1.36):
- authorization: `patch` on `resourceclaims/status`, and for each driver whose entries the
  write changes, `associated-node:patch` on `resourceclaims/driver` named after the driver
  when the caller's service account token is bound to the node the claim is allocated on
  (its allocation's nodeSelector names that one node), else `arbitrary-node:patch`; refused
  with 403;
- `status.devices` is a map list keyed by (driver, pool, device, shareID): an apply merges
  the manager's entries into it by key, leaves other managers' entries be, and removes the
  entries this manager sent before and does not now; an entry another manager owns is a
  409 conflict unless the apply is forced;
- each entry must be a device of the claim's allocation (422 otherwise), and keep the API's
  limits: at most 8 conditions, each with a type, a status of True, False or Unknown, a
  reason in CamelCase and a lastTransitionTime; at most 16 ips, each a CIDR, no repeats;
  an interfaceName of at most 256 bytes and a hardwareAddress of at most 128; data of at
  most 10 KiB. Each entry must deserialize into the kubernetes client's
  V1AllocatedDeviceStatus.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client import V1AllocatedDeviceStatus

APPLY = "application/apply-patch+yaml"
CONDITIONS = 8
CONDITION_STATUSES = {"True", "False", "Unknown"}
REASON = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")
IPS = 16
INTERFACE_NAME = 256
HARDWARE_ADDRESS = 128
DATA_BYTES = 10 * 1024
# The permissions a driver's status write needs (testbed/dra/apiserver.py grants them to the
# plugin's identity; tests/unit/test_manifests.py checks that deploy/kubernetes does).
STATUS_PATCH = ("resourceclaims/status", "patch")
ASSOCIATED_NODE_PATCH = ("resourceclaims/driver", "associated-node:patch")
ARBITRARY_NODE_PATCH = ("resourceclaims/driver", "arbitrary-node:patch")

Key = tuple[str, str, str, str]  # driver, pool, device, shareID


class Refusal(Exception):
    """An apply the API server refuses: its HTTP code, Status reason and message."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


@dataclass
class StatusStore:
    """The owners of each claim's status.devices entries, and what the caller may do."""

    node: str  # the node the caller's token is bound to
    granted: set[tuple[str, str]] = field(
        default_factory=lambda: {STATUS_PATCH, ASSOCIATED_NODE_PATCH}
    )
    owners: dict[tuple[str, str], dict[Key, str]] = field(default_factory=dict)
    writes: int = 0

    def apply(self, claim: dict[str, Any], body: dict[str, Any], manager: str, force: bool) -> None:
        """Apply `body` to `claim` (changed in place); Refusal as the API server answers."""
        if not manager:
            raise Refusal(400, "BadRequest", "fieldManager is required for apply requests")
        _check_object(claim, body)
        status = claim.setdefault("status", {})
        applied = [_entry(e) for e in (body.get("status") or {}).get("devices") or []]
        owners = self.owners.setdefault(_name(claim), {})
        keys = [_key(e) for e in applied]
        if len(set(keys)) != len(keys):
            raise _invalid(f"status.devices: duplicate entries: {keys}")
        allocated = _allocated(status)
        for key in keys:
            if key not in allocated:
                raise _invalid(f"status.devices {key}: must be an allocated device in the claim")
            if owners.get(key, manager) != manager and not force:
                raise Refusal(409, "Conflict", f"status.devices {key} is {owners[key]}'s")
        current = {_key(e): e for e in status.get("devices") or []}
        dropped = {k for k, m in owners.items() if m == manager and k not in keys}
        merged = {k: e for k, e in current.items() if k not in dropped}
        merged.update(zip(keys, applied, strict=True))
        changed = {k[0] for k in set(current) | set(merged) if current.get(k) != merged.get(k)}
        self._authorize(status, changed)
        for key in dropped:
            del owners[key]
        owners.update((key, manager) for key in keys)
        if merged:
            status["devices"] = list(merged.values())
        else:
            status.pop("devices", None)
        self.writes += 1

    def _authorize(self, status: dict[str, Any], drivers: set[str]) -> None:
        if STATUS_PATCH not in self.granted:
            raise _forbidden("patch", "resourceclaims/status", "")
        local = _allocated_node(status) == self.node
        for driver in sorted(drivers):
            if ARBITRARY_NODE_PATCH in self.granted:
                continue
            if not (local and ASSOCIATED_NODE_PATCH in self.granted):
                verb = (ASSOCIATED_NODE_PATCH if local else ARBITRARY_NODE_PATCH)[1]
                raise _forbidden(verb, "resourceclaims/driver", driver)


def _name(claim: dict[str, Any]) -> tuple[str, str]:
    return claim["metadata"]["namespace"], claim["metadata"]["name"]


def _check_object(claim: dict[str, Any], body: dict[str, Any]) -> None:
    if (body.get("apiVersion"), body.get("kind")) != ("resource.k8s.io/v1", "ResourceClaim"):
        raise Refusal(
            400, "BadRequest", f"apiVersion/kind {body.get('apiVersion')}/{body.get('kind')}"
        )
    meta = body.get("metadata") or {}
    if (meta.get("namespace"), meta.get("name")) != _name(claim):
        raise Refusal(400, "BadRequest", f"metadata {meta} does not name the claim")


def _key(entry: dict[str, Any]) -> Key:
    return entry["driver"], entry["pool"], entry["device"], entry.get("shareID", "")


def _allocated(status: dict[str, Any]) -> set[Key]:
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    return {_key(r) for r in results}


def _allocated_node(status: dict[str, Any]) -> str | None:
    """The one node the allocation's nodeSelector names (metadata.name In [node]), if so."""
    terms = ((status.get("allocation") or {}).get("nodeSelector") or {}).get("nodeSelectorTerms")
    if not terms or len(terms) != 1:
        return None
    fields = terms[0].get("matchFields") or []
    if len(fields) != 1 or fields[0].get("key") != "metadata.name":
        return None
    values = fields[0].get("values") or []
    return values[0] if fields[0].get("operator") == "In" and len(values) == 1 else None


def _entry(entry: dict[str, Any]) -> dict[str, Any]:
    """`entry`, checked as the API server validates an AllocatedDeviceStatus."""
    try:
        V1AllocatedDeviceStatus.model_validate(entry)
    except ValueError as e:  # pydantic's ValidationError
        raise _invalid(f"not a V1AllocatedDeviceStatus: {e}") from e
    where = f"status.devices {entry.get('device')!r}"
    faults = _condition_faults(entry.get("conditions") or [])
    faults += _network_faults(entry.get("networkData") or {})
    if len(json.dumps(entry.get("data", ""))) > DATA_BYTES:
        faults.append("data over 10 KiB")
    if faults:
        raise _invalid(f"{where}: {'; '.join(faults)}")
    copied: dict[str, Any] = json.loads(json.dumps(entry))
    return copied


def _condition_faults(conditions: list[dict[str, Any]]) -> list[str]:
    out = [f"{len(conditions)} conditions"] if len(conditions) > CONDITIONS else []
    types = [c.get("type") for c in conditions]
    if len(set(types)) != len(types):
        out.append(f"condition types repeat: {types}")
    for c in conditions:
        if c.get("status") not in CONDITION_STATUSES:
            out.append(f"condition {c.get('type')}: status {c.get('status')!r}")
        if not REASON.fullmatch(c.get("reason") or ""):
            out.append(f"condition {c.get('type')}: reason {c.get('reason')!r}")
        if not c.get("lastTransitionTime"):
            out.append(f"condition {c.get('type')}: no lastTransitionTime")
    return out


def _network_faults(data: dict[str, Any]) -> list[str]:
    out = []
    if len(data.get("interfaceName", "")) > INTERFACE_NAME:
        out.append("interfaceName over 256 bytes")
    if len(data.get("hardwareAddress", "")) > HARDWARE_ADDRESS:
        out.append("hardwareAddress over 128 bytes")
    ips = data.get("ips") or []
    if len(ips) > IPS:
        out.append(f"{len(ips)} ips")
    if len(set(ips)) != len(ips):
        out.append(f"ips repeat: {ips}")
    for ip in ips:
        try:
            ipaddress.ip_interface(ip)
        except ValueError:
            out.append(f"ip {ip!r} is not a CIDR")
        if "/" not in ip:
            out.append(f"ip {ip!r} has no prefix length")
    return out


def _invalid(message: str) -> Refusal:
    return Refusal(422, "Invalid", message)


def _forbidden(verb: str, resource: str, name: str) -> Refusal:
    named = f" {name!r}" if name else ""
    return Refusal(
        403,
        "Forbidden",
        f'cannot {verb} resource {resource!r}{named} in API group "resource.k8s.io"',
    )
