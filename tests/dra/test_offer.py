"""What the node offers: rdmad's devices as resource.k8s.io/v1 devices, whole and, in
shared netns mode, as share slots up to rdmad's shared limit, within the API's limits
(rdmad/dra/offer.py)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from rdmad.dra.offer import (
    COUNTER_SETS_PER_SLICE,
    DEVICES_PER_SLICE,
    DEVICES_PER_SLICE_WITH_COUNTERS,
    LABEL_BYTES,
    PCI_BUS_ID,
    PCIE_ROOT,
    RdmadState,
    check_device,
    device_name,
    in_slices,
    is_slot,
    offered,
    partitioned,
    rdma_device_of,
    slot_name,
)
from rdmad.dra.owner import owner_label
from testbed.dra.apiserver import DNS_LABEL

HOST_PCI = sorted(os.listdir("/sys/bus/pci/devices"))


def props(name: str = "mlx5_0", state: str = "available", **more: Any) -> dict[str, Any]:
    """rdmad's Device properties, as GetManagedObjects gives them."""
    return {
        "Name": name,
        "NetDevice": "ens1f0",
        "Driver": "mlx5_core",
        "LinkLayer": "Ethernet",
        "PciAddress": "",
        "NumaNode": 1,
        "NodeGuid": "0002:c903:0031:7a40",
        "State": state,
        "Ports": [(1, "ACTIVE", "LINK_UP", "ens1f0")],
        "Carrier": True,
        **more,
    }


def claim(device: str = "mlx5_0", owner: str = "") -> dict[str, Any]:
    """rdmad's Claim properties, as far as the offer reads them."""
    return {"Device": device, "Owner": owner, "Shared": True}


def offer(
    *devices: dict[str, Any],
    mode: str = "shared",
    claims: tuple[dict[str, Any], ...] = (),
    limit: int = 3,
) -> list[dict[str, Any]]:
    return offered(RdmadState(list(devices), list(claims), mode, limit))


def whole(*devices: dict[str, Any], mode: str = "shared") -> list[dict[str, Any]]:
    """The whole devices of the offer."""
    return [d for d in offer(*devices, mode=mode) if not is_slot(d["name"])]


def slots(*devices: dict[str, Any], **kw: Any) -> list[str]:
    """The names of the offer's share slots."""
    return [d["name"] for d in offer(*devices, **kw) if is_slot(d["name"])]


def test_an_available_device_is_offered_with_rdmads_facts_as_attributes() -> None:
    (device,) = offer(props(), mode="exclusive")
    assert device == {
        "name": "mlx5-0",
        "attributes": {
            "rdmaDevice": {"string": "mlx5_0"},
            "netdev": {"string": "ens1f0"},
            "driver": {"string": "mlx5_core"},
            "linkLayer": {"string": "Ethernet"},
            "nodeGuid": {"string": "0002:c903:0031:7a40"},
            "netnsMode": {"string": "exclusive"},
            "numaNode": {"int": 1},
            "shared": {"bool": False},
        },
    }


@pytest.mark.skipif(not HOST_PCI, reason="this host has no PCI devices in sysfs")
def test_a_pci_device_carries_its_bus_id_and_pcie_root_from_sysfs() -> None:
    address = HOST_PCI[0]
    root = os.path.realpath(f"/sys/bus/pci/devices/{address}").split("/")[3]
    (device,) = whole(props(PciAddress=address))
    assert device["attributes"][PCI_BUS_ID] == {"string": address}
    assert device["attributes"][PCIE_ROOT] == {"string": root}
    assert root.startswith("pci")


def test_a_pci_address_this_host_does_not_have_gets_no_pcie_root() -> None:
    (device,) = whole(props(PciAddress="ffff:ff:1f.7"))
    assert PCIE_ROOT not in device["attributes"]


@pytest.mark.parametrize("state", ["claimed", "unavailable"])
def test_a_device_held_whole_or_unusable_is_withdrawn_with_its_slots(state: str) -> None:
    assert offer(props("mlx5_0", state), props("mlx5_1")) == offer(props("mlx5_1"))


def test_a_shared_device_is_withdrawn_whole() -> None:
    assert whole(props("mlx5_0", "shared"), props("mlx5_1")) == whole(props("mlx5_1"))


def test_unknown_facts_are_left_out_not_offered_empty() -> None:
    (device,) = whole(props(NetDevice="", NodeGuid="", NumaNode=-1))
    assert not {"netdev", "nodeGuid", "numaNode"} & set(device["attributes"])


def test_a_string_over_64_bytes_is_left_out() -> None:
    (device,) = whole(props(Driver="d" * 65))
    assert "driver" not in device["attributes"]
    check_device(device)


def test_kernel_style_names_map_one_to_one_and_others_are_hashed() -> None:
    assert device_name("mlx5_0") == "mlx5-0" and device_name("rxe0") == "rxe0"
    odd = ["Mlx5_0", "ib-0", "a" * 64, "x_"]
    names = [device_name(n) for n in odd]
    assert all(DNS_LABEL.fullmatch(n) for n in names)
    assert len(set(names)) == len(odd)


def test_two_devices_that_would_share_a_name_offer_only_the_first() -> None:
    a, b = props("mlx5_0"), props("mlx5_0")
    assert [d["name"] for d in whole(a, b)] == ["mlx5-0"]


def sizes(slices: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(kind, len(items)) for s in slices for kind, items in s.items()]


def test_devices_go_in_slices_of_at_most_128_and_none_is_one_empty_slice() -> None:
    devices = offer(*[props(f"mlx5_{i}") for i in range(300)], mode="exclusive")
    assert sizes(in_slices(devices)) == [
        ("devices", DEVICES_PER_SLICE),
        ("devices", DEVICES_PER_SLICE),
        ("devices", 44),
    ]
    assert in_slices([]) == [{"devices": []}]


def test_a_device_over_the_attribute_limit_is_refused() -> None:
    attributes = {f"a{i}": {"int": i} for i in range(33)}
    with pytest.raises(ValueError, match="over 32 attributes"):
        check_device({"name": "d", "attributes": attributes})


# --- shared mode: share slots ---


def test_a_free_device_in_shared_mode_offers_a_slot_per_share_of_rdmads_limit() -> None:
    assert slots(props(), limit=3) == [slot_name("mlx5_0", i) for i in range(3)]
    assert slot_name("mlx5_0", 2) == "mlx5-0--share-2"


def test_a_slot_carries_the_devices_attributes_and_shared_true() -> None:
    (device,) = whole(props())
    slot = offer(props(), limit=1)[1]
    assert slot["attributes"] == {**device["attributes"], "shared": {"bool": True}}


def test_exclusive_mode_offers_no_slots() -> None:
    # rdmad refuses shared claims there: the RDMA device moves into one netns whole.
    assert slots(props(), mode="exclusive") == []


def test_a_device_without_a_netdev_offers_no_slots() -> None:
    # a share is a macvlan child of the device's netdev
    assert slots(props(NetDevice="")) == []


def test_each_share_taken_outside_kubernetes_withdraws_a_slot() -> None:
    taken = (claim(owner="ctr-1"),)
    assert slots(props("mlx5_0", "shared"), claims=taken, limit=3) == [
        "mlx5-0--share-0",
        "mlx5-0--share-1",
    ]


def test_no_free_share_leaves_no_free_slot() -> None:
    taken = tuple(claim(owner=f"ctr-{i}") for i in range(3))
    assert slots(props("mlx5_0", "shared"), claims=taken, limit=3) == []


def test_the_slots_kubernetes_holds_stay_published_under_their_names() -> None:
    # The scheduler counts mlx5-0--share-2 allocated: it stays, and the share a container
    # took outside is one of the free ones that goes.
    taken = (claim(owner=owner_label("uid-a", "mlx5-0--share-2")), claim(owner="ctr-1"))
    assert slots(props("mlx5_0", "shared"), claims=taken, limit=3) == [
        "mlx5-0--share-0",
        "mlx5-0--share-2",
    ]


def test_a_hold_naming_another_devices_slot_is_not_this_devices() -> None:
    taken = (claim(owner=owner_label("uid-a", "mlx5-1--share-2")),)
    assert slots(props("mlx5_0", "shared"), claims=taken, limit=2) == ["mlx5-0--share-0"]


def test_slot_names_never_collide_with_whole_device_names() -> None:
    # kernel-style names have no "__", so no whole device's name holds "--"
    names = ["mlx5_0", "mlx5_0_share_1", "a" * 63, "Odd-Name"]
    whole_names = {device_name(n) for n in names}
    slot_names = {slot_name(n, i) for n in names for i in range(20)}
    assert not whole_names & slot_names
    assert all(len(n) <= LABEL_BYTES and DNS_LABEL.fullmatch(n) for n in slot_names)
    assert not any(is_slot(n) for n in whole_names)


def test_a_published_name_leads_back_to_its_rdma_device() -> None:
    listed = ["mlx5_0", "mlx5_0_share_1", "a" * 63]
    for rdma in listed:
        assert rdma_device_of(device_name(rdma), listed) == rdma
        assert rdma_device_of(slot_name(rdma, 7), listed) == rdma
    assert rdma_device_of("mlx5-9", listed) is None
    assert rdma_device_of("mlx5-0--share-01", listed) is None


def test_slots_count_against_the_slice_limit_like_devices() -> None:
    devices = offer(*[props(f"mlx5_{i}") for i in range(8)], limit=16)
    assert len(devices) == 8 * 17
    assert sizes(in_slices(devices)) == [("devices", DEVICES_PER_SLICE), ("devices", 8)]


# --- partitionable devices (KEP-4815): the slots and the whole device share counters ---


def consumed(devices: list[dict[str, Any]]) -> dict[str, Any]:
    """Each device's consumption, by name: {counter set: shares}."""
    return {
        d["name"]: {
            c["counterSet"]: c["counters"]["shares"]["value"] for c in d.get("consumesCounters", [])
        }
        for d in devices
    }


def test_a_devices_counter_set_has_a_share_per_slot_the_whole_device_takes_them_all() -> None:
    devices, counter_sets = partitioned(offer(props("mlx5_0"), limit=3))
    assert counter_sets == [{"name": "mlx5-0", "counters": {"shares": {"value": "3"}}}]
    assert consumed(devices) == {
        "mlx5-0": {"mlx5-0": "3"},
        "mlx5-0--share-0": {"mlx5-0": "1"},
        "mlx5-0--share-1": {"mlx5-0": "1"},
        "mlx5-0--share-2": {"mlx5-0": "1"},
    }


def test_a_share_taken_outside_kubernetes_shrinks_the_counter_set_with_the_slots() -> None:
    taken = (claim(owner=owner_label("uid-a", "mlx5-0--share-0")), claim(owner="ctr-1"))
    devices, counter_sets = partitioned(offer(props("mlx5_0", "shared"), claims=taken, limit=3))
    # the held slot, still the scheduler's, and one free: the outside share took the third
    assert counter_sets == [{"name": "mlx5-0", "counters": {"shares": {"value": "2"}}}]
    assert consumed(devices) == {
        "mlx5-0--share-0": {"mlx5-0": "1"},
        "mlx5-0--share-1": {"mlx5-0": "1"},
    }


def test_a_device_without_slots_consumes_no_counters() -> None:
    devices, counter_sets = partitioned(offer(props("mlx5_0"), mode="exclusive"))
    assert counter_sets == [] and consumed(devices) == {"mlx5-0": {}}


def test_counter_sets_take_slices_of_their_own_and_partitions_slices_of_64() -> None:
    devices, counter_sets = partitioned(offer(*[props(f"mlx5_{i}") for i in range(9)], limit=16))
    assert sizes(in_slices(devices, counter_sets)) == [
        ("sharedCounters", COUNTER_SETS_PER_SLICE),
        ("sharedCounters", 1),
        ("devices", DEVICES_PER_SLICE_WITH_COUNTERS),
        ("devices", DEVICES_PER_SLICE_WITH_COUNTERS),
        ("devices", 9 * 17 - 2 * DEVICES_PER_SLICE_WITH_COUNTERS),
    ]
