"""What the node offers: rdmad's devices as resource.k8s.io/v1 devices, within the API's
limits (rdmad/dra/offer.py)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from rdmad.dra.offer import (
    DEVICES_PER_SLICE,
    PCI_BUS_ID,
    PCIE_ROOT,
    check_device,
    device_name,
    in_slices,
    offered,
)
from tests.dra.apiserver import DNS_LABEL

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
        **more,
    }


def test_an_available_device_is_offered_with_rdmads_facts_as_attributes() -> None:
    (device,) = offered([props()], "exclusive")
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
        },
    }


@pytest.mark.skipif(not HOST_PCI, reason="this host has no PCI devices in sysfs")
def test_a_pci_device_carries_its_bus_id_and_pcie_root_from_sysfs() -> None:
    address = HOST_PCI[0]
    root = os.path.realpath(f"/sys/bus/pci/devices/{address}").split("/")[3]
    (device,) = offered([props(PciAddress=address)], "shared")
    assert device["attributes"][PCI_BUS_ID] == {"string": address}
    assert device["attributes"][PCIE_ROOT] == {"string": root}
    assert root.startswith("pci")


def test_a_pci_address_this_host_does_not_have_gets_no_pcie_root() -> None:
    (device,) = offered([props(PciAddress="ffff:ff:1f.7")], "shared")
    assert PCIE_ROOT not in device["attributes"]


@pytest.mark.parametrize("state", ["claimed", "shared", "unavailable"])
def test_a_device_held_or_unusable_outside_kubernetes_is_withdrawn(state: str) -> None:
    assert offered([props("mlx5_0", state), props("mlx5_1")], "shared") == offered(
        [props("mlx5_1")], "shared"
    )


def test_unknown_facts_are_left_out_not_offered_empty() -> None:
    (device,) = offered([props(NetDevice="", NodeGuid="", NumaNode=-1)], "shared")
    assert not {"netdev", "nodeGuid", "numaNode"} & set(device["attributes"])


def test_a_string_over_64_bytes_is_left_out() -> None:
    (device,) = offered([props(Driver="d" * 65)], "shared")
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
    assert [d["name"] for d in offered([a, b], "shared")] == ["mlx5-0"]


def test_devices_go_in_slices_of_at_most_128_and_none_is_one_empty_slice() -> None:
    devices = offered([props(f"mlx5_{i}") for i in range(300)], "shared")
    assert [len(s) for s in in_slices(devices)] == [DEVICES_PER_SLICE, DEVICES_PER_SLICE, 44]
    assert in_slices([]) == [[]]


def test_a_device_over_the_attribute_limit_is_refused() -> None:
    attributes = {f"a{i}": {"int": i} for i in range(33)}
    with pytest.raises(ValueError, match="over 32 attributes"):
        check_device({"name": "d", "attributes": attributes})
