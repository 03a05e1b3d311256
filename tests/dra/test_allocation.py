"""What prepare reads from a ResourceClaim (rdmad/dra/allocation.py): this driver's devices
on this node, the one pod it is reserved for, and the opaque parameters; each fault a clear
error naming the claim. Pure: no API server, no rdmad."""

from __future__ import annotations

from typing import Any

import pytest

from rdmad.dra.allocation import Params, Refused, Wanted, allocation_of
from testbed.dra.claims import DRIVER, NODE, POD_UID, claim

UID = "0b9f2c1e-1111-4c3e-9a6e-000000000001"
SLOT = "mlx5-0--share-3"  # a share slot of mlx5_0 (rdmad/dra/offer.py)


def read(c: dict[str, Any], uid: str = UID) -> Any:
    return allocation_of(c, uid, DRIVER, NODE)


def test_the_devices_of_this_driver_are_held_for_the_reserving_pod() -> None:
    got = read(claim(UID, ["mlx5-0", "mlx5-1"]))
    assert got.pod_uid == POD_UID
    assert got.devices == (
        Wanted("rdma", NODE, "mlx5-0", False, Params()),
        Wanted("rdma", NODE, "mlx5-1", False, Params()),
    )


def test_results_of_other_drivers_are_not_ours() -> None:
    c = claim(UID, ["mlx5-0"])
    c["status"]["allocation"]["devices"]["results"].append(
        {"request": "gpu", "driver": "gpu.example.com", "pool": "elsewhere", "device": "gpu-0"}
    )
    assert [w.device for w in read(c).devices] == ["mlx5-0"]


def test_parameters_become_the_holds_options() -> None:
    params = {"shared": True, "interfaceName": "rdma0", "mtu": 9000, "chardevs": ["uverbs"]}
    (wanted,) = read(claim(UID, [SLOT], parameters=params)).devices
    assert wanted.params == Params(shared=True, ifname="rdma0", mtu=9000, chardevs=("uverbs",))


def test_a_config_for_another_request_does_not_apply() -> None:
    c = claim(UID, ["mlx5-0"], parameters={"mtu": 9000})
    c["status"]["allocation"]["devices"]["config"][0]["requests"] = ["other"]
    assert read(c).devices[0].params == Params()


def test_the_claims_config_overrides_the_classs() -> None:
    c = claim(UID, [SLOT], parameters={"mtu": 9000})
    from_class = {
        "source": "FromClass",
        "opaque": {"driver": DRIVER, "parameters": {"mtu": 1500, "shared": True}},
    }
    c["status"]["allocation"]["devices"]["config"].insert(0, from_class)
    assert read(c).devices[0].params == Params(shared=True, mtu=9000)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda c: c["status"].clear(), "ResourceClaim default/pod-a-rdma is not allocated"),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(pool="node-b"),
            "is allocated to another node: device 'mlx5-0' of pool 'node-b'",
        ),
        (lambda c: c["status"].pop("reservedFor"), "is reserved for no pod"),
        (
            lambda c: c["status"]["reservedFor"].append(
                {"resource": "pods", "name": "b", "uid": "b"}
            ),
            "is reserved for 2 pods",
        ),
        (lambda c: c["metadata"].update(uid="other"), "has UID 'other'"),
    ],
)
def test_a_claim_that_is_not_this_nodes_to_prepare_is_refused(change: Any, error: str) -> None:
    c = claim(UID, ["mlx5-0"])
    change(c)
    with pytest.raises(Refused, match=error):
        read(c)


@pytest.mark.parametrize(
    ("parameters", "error"),
    [
        ({"colour": "red"}, "unknown parameter 'colour'"),
        ({"mtu": "9000"}, "parameter 'mtu' must be a JSON integer"),
        ({"shared": 1}, "parameter 'shared' must be a JSON boolean"),
        ({"mtu": 67}, "invalid parameters: mtu 67 is out of range"),
        ({"chardevs": ["uverbs", "tape"]}, "invalid parameters: .*tape"),
        ({"interfaceName": "a/b"}, "invalid parameters: .*a/b"),
        ({"kind": "GpuConfig"}, "parameters of kind 'GpuConfig'"),
    ],
)
def test_invalid_parameters_are_the_claims_error(parameters: dict[str, Any], error: str) -> None:
    with pytest.raises(Refused, match=f"ResourceClaim default/pod-a-rdma: {error}"):
        read(claim(UID, ["mlx5-0"], parameters=parameters))


def test_a_share_slot_is_held_shared_and_a_whole_device_whole() -> None:
    whole, slot = read(claim(UID, ["mlx5-0", SLOT])).devices
    assert (whole.shared, slot.shared) == (False, True)


@pytest.mark.parametrize(
    ("device", "shared", "error"),
    [
        (SLOT, False, f"allocated the share slot {SLOT}, but its parameter 'shared' is false"),
        ("mlx5-0", True, "allocated the whole device mlx5-0, but its parameter 'shared' is true"),
    ],
)
def test_a_shared_parameter_that_disagrees_with_the_allocation_is_the_claims_error(
    device: str, shared: bool, error: str
) -> None:
    with pytest.raises(
        Refused, match=f"ResourceClaim default/pod-a-rdma: request 'rdma' was {error}"
    ):
        read(claim(UID, [device], parameters={"shared": shared}))
