"""The device status alone: the conditions and networkData rdmad-dra makes of rdmad's
claim properties (rdmad/dra/claim_status.py), and the API server double's status
subresource refusing what the real one refuses (testbed/dra/claim_status.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes.client import V1NetworkDeviceData

from rdmad.dra.claim_status import MAX_IPS, conditions, network_data
from testbed.dra.claim_status import (
    ARBITRARY_NODE_PATCH,
    ASSOCIATED_NODE_PATCH,
    STATUS_PATCH,
    Refusal,
    StatusStore,
)
from testbed.dra.claims import DRIVER, NODE, claim

HELD = {
    "Id": "3f2a9c0d4b5e6f70",
    "Device": "sim0",
    "State": "held",
    "Failure": "",
    "InterfaceName": "rdma0",
    "Addresses": [],
    "MacAddress": "",
}
ACTIVE = {
    **HELD,
    "State": "active",
    "Addresses": ["192.0.2.5/24"],
    "MacAddress": "02:00:00:00:00:07",
}


@pytest.mark.parametrize(
    ("props", "was_attached", "expected"),
    [
        (HELD, False, [("Ready", "True", "Held")]),
        (ACTIVE, False, [("Ready", "True", "Held"), ("NetworkReady", "True", "Attached")]),
        (HELD, True, [("Ready", "True", "Held"), ("NetworkReady", "False", "Detached")]),
        (
            {**HELD, "State": "not-returned", "Failure": "EBUSY"},
            True,
            [("Ready", "False", "NotReturned")],
        ),
    ],
    ids=["held", "attached", "detached", "not-returned"],
)
def test_conditions_follow_the_rdmad_claims_state(
    props: dict[str, Any], was_attached: bool, expected: list[tuple[str, str, str]]
) -> None:
    assert [c[:3] for c in conditions(props, was_attached)] == expected


def test_network_data_is_the_interface_its_cidrs_and_its_mac() -> None:
    data = network_data(ACTIVE)
    V1NetworkDeviceData.model_validate(data)
    assert data == {
        "interfaceName": "rdma0",
        "ips": ["192.0.2.5/24"],
        "hardwareAddress": "02:00:00:00:00:07",
    }


def test_network_data_leaves_empty_fields_out_and_keeps_the_apis_limit_of_ips() -> None:
    many = [f"192.0.2.{n}/24" for n in range(1, 20)]
    data = network_data({**ACTIVE, "Addresses": many, "MacAddress": ""})
    assert data == {"interfaceName": "rdma0", "ips": many[:MAX_IPS]}


READY = {
    "type": "Ready",
    "status": "True",
    "reason": "Held",
    "message": "",
    "lastTransitionTime": "2026-11-29T12:00:00Z",
}


def test_the_network_data_of_a_device_moved_without_its_netdev_is_empty() -> None:
    assert network_data({**ACTIVE, "InterfaceName": "", "Addresses": [], "MacAddress": ""}) == {}


def entry(**changes: Any) -> dict[str, Any]:
    return {"driver": DRIVER, "pool": NODE, "device": "sim0", "conditions": [READY], **changes}


def apply(
    store: StatusStore,
    served: dict[str, Any],
    *entries: dict[str, Any],
    manager: str = DRIVER,
    force: bool = True,
) -> None:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": copy.deepcopy(served["metadata"]),
        "status": {"devices": list(entries)} if entries else {},
    }
    store.apply(served, body, manager, force)


def test_the_double_merges_by_key_and_drops_what_the_manager_no_longer_sends() -> None:
    store, served = StatusStore(NODE), claim("u1", ["sim0", "sim1"])
    apply(store, served, entry(), entry(device="sim1"))
    apply(store, served, entry(device="sim1"))
    assert [e["device"] for e in served["status"]["devices"]] == ["sim1"]
    apply(store, served)
    assert "devices" not in served["status"]


@pytest.mark.parametrize(
    ("changes", "granted", "code", "text"),
    [
        ({"device": "sim7"}, None, 422, "must be an allocated device"),
        ({"networkData": {"ips": ["192.0.2.5"]}}, None, 422, "has no prefix length"),
        ({"networkData": {"ips": ["192.0.2.5/24", "192.0.2.5/24"]}}, None, 422, "ips repeat"),
        ({"conditions": [{**READY, "status": "Yes"}]}, None, 422, "status 'Yes'"),
        ({"conditions": [{**READY, "reason": "held by rdmad"}]}, None, 422, "reason"),
        ({"conditions": [{"type": "Ready", "status": "True"}]}, None, 422, "lastTransitionTime"),
        ({}, {STATUS_PATCH}, 403, "associated-node:patch"),
        ({}, {ASSOCIATED_NODE_PATCH}, 403, "resourceclaims/status"),
    ],
    ids=[
        "unallocated",
        "no-prefix",
        "repeated-ip",
        "status-yes",
        "reason-with-spaces",
        "no-transition-time",
        "no-driver-verb",
        "no-status-verb",
    ],
)
def test_the_double_refuses_what_the_api_server_refuses(
    changes: dict[str, Any], granted: set[tuple[str, str]] | None, code: int, text: str
) -> None:
    store, served = StatusStore(NODE), claim("u1", ["sim0"])
    if granted is not None:
        store.granted = granted
    with pytest.raises(Refusal) as refused:
        apply(store, served, entry(**changes))
    assert refused.value.code == code and text in refused.value.message


def test_a_claim_allocated_on_another_node_needs_the_arbitrary_node_verb() -> None:
    store, served = StatusStore(NODE), claim("u1", ["sim0"], pool="node-b")
    with pytest.raises(Refusal, match="arbitrary-node:patch"):
        apply(store, served, entry(pool="node-b"))
    store.granted = {STATUS_PATCH, ARBITRARY_NODE_PATCH}
    apply(store, served, entry(pool="node-b"))


def test_another_managers_entry_is_a_conflict_unless_forced() -> None:
    store, served = StatusStore(NODE), claim("u1", ["sim0"])
    apply(store, served, entry(), manager="someone-else")
    with pytest.raises(Refusal) as refused:
        apply(store, served, entry(), force=False)
    assert refused.value.code == 409
    apply(store, served, entry())
    assert store.owners[("default", "pod-a-rdma")] == {(DRIVER, NODE, "sim0", ""): DRIVER}
