"""Contract tests of the parameters hcaHandles and hcaObjects: the kubelet prepares a
claim whose parameters ask for an RDMA limit; rdmad-dra finds the pod's cgroup from its
UID, under either of the kubelet's cgroup drivers and in its QoS class, and holds the
device with the limit for that cgroup. rdmad and the plugin share a tree shaped as the
cgroup2 mount (tests/support/cgroup_tree.py); the kernel's side is the guest tests'."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rdmad.dra.podcgroup import pod_cgroups
from testbed.dra import kubelet
from testbed.dra.apiserver import ApiServer
from testbed.dra.claims import POD_UID
from testbed.dra.plugin_process import Plugin, running_plugin
from testbed.net import require_root
from tests.dra.contract import CLAIM_IFACE, holds, prepare, serve
from tests.support.cgroup_tree import make_tree
from tests.support.sim_rig import Rig, running_rig

pytestmark = pytest.mark.bus  # a private dbus-daemon

A = kubelet.Claim("default", "0b9f2c1e-1111-4c3e-9a6e-000000000001", "pod-a-rdma")
UNIT = POD_UID.replace("-", "_")
LIMITS = {"hcaHandles": 1, "hcaObjects": 64}


@pytest.fixture(autouse=True)
def _root() -> None:
    require_root()


@pytest.fixture
def cgroups(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "cgroup")


@pytest.fixture
async def rig(bus_address: str, tmp_path: Path, cgroups: Path) -> AsyncIterator[Rig]:
    async with running_rig(bus_address, tmp_path, extra=["--cgroup-root", str(cgroups)]) as r:
        yield r


@pytest.fixture
async def plugin(api: ApiServer, rig: Rig, tmp_path: Path, cgroups: Path) -> AsyncIterator[Plugin]:
    extra = ["--cgroup-root", str(cgroups)]
    async with running_plugin(api, rig.daemon.bus_address, tmp_path / "dra", extra=extra) as p:
        yield p


def test_a_pods_cgroup_is_named_as_each_driver_and_qos_class_names_it() -> None:
    assert pod_cgroups("0f6a2c44-7d1e-4c8e-9a55-3b7e1c2d9f10") == (
        "kubepods.slice/kubepods-pod0f6a2c44_7d1e_4c8e_9a55_3b7e1c2d9f10.slice",
        "kubepods.slice/kubepods-burstable.slice/"
        "kubepods-burstable-pod0f6a2c44_7d1e_4c8e_9a55_3b7e1c2d9f10.slice",
        "kubepods.slice/kubepods-besteffort.slice/"
        "kubepods-besteffort-pod0f6a2c44_7d1e_4c8e_9a55_3b7e1c2d9f10.slice",
        "kubepods/pod0f6a2c44-7d1e-4c8e-9a55-3b7e1c2d9f10",
        "kubepods/burstable/pod0f6a2c44-7d1e-4c8e-9a55-3b7e1c2d9f10",
        "kubepods/besteffort/pod0f6a2c44-7d1e-4c8e-9a55-3b7e1c2d9f10",
    )


@pytest.mark.parametrize("uid", ["../..", "a/b", ""])
def test_a_pod_uid_that_is_no_uuid_names_no_cgroup(uid: str) -> None:
    with pytest.raises(ValueError, match="not a UUID"):
        pod_cgroups(uid)


@pytest.mark.parametrize(
    "pod_cgroup",
    [
        f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UNIT}.slice",
        f"kubepods.slice/kubepods-pod{UNIT}.slice",  # guaranteed
        f"kubepods/burstable/pod{POD_UID}",
        f"kubepods/pod{POD_UID}",  # guaranteed
    ],
)
async def test_a_limited_claim_is_held_with_its_limits_for_the_pods_cgroup(
    api: ApiServer, rig: Rig, plugin: Plugin, cgroups: Path, pod_cgroup: str
) -> None:
    make_tree(cgroups, pod_cgroup)
    serve(api, A, ["sim0"], parameters=LIMITS)
    got = await prepare(plugin, A)
    assert got[A.uid].error == ""
    (row,) = await rig.client.manager("ListClaims")
    assert await rig.client.prop(row[5], CLAIM_IFACE, "Cgroup") == pod_cgroup
    limit = await rig.client.prop(row[5], CLAIM_IFACE, "RdmaLimit")
    assert limit == {"hca_handle": 1, "hca_object": 64}


async def test_a_limited_claim_whose_pod_has_no_cgroup_is_refused_and_holds_nothing(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    serve(api, A, ["sim0"], parameters=LIMITS)
    got = await prepare(plugin, A)
    assert f"need the cgroup of pod {POD_UID}" in got[A.uid].error
    assert await holds(rig) == []


@pytest.mark.parametrize(
    ("parameters", "error"),
    [
        ({"hcaHandles": -1}, "hca_handles -1 is out of range"),
        ({"hcaObjects": 2**31}, "hca_objects 2147483648 is out of range"),
        ({"hcaHandles": "1"}, "parameter 'hcaHandles' must be a JSON integer"),
    ],
)
async def test_a_limit_rdmad_cannot_take_is_the_claims_error(
    api: ApiServer, rig: Rig, plugin: Plugin, parameters: dict[str, object], error: str
) -> None:
    serve(api, A, ["sim0"], parameters=parameters)
    got = await prepare(plugin, A)
    assert error in got[A.uid].error
    assert await holds(rig) == []
