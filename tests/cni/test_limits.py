"""RDMA limits from the network config (cgroup, hcaHandles, hcaObjects): ADD writes the
claimed device's line in the cgroup's rdma.max, DEL puts it back to `max`; a limit rdmad
cannot apply fails the ADD and leaves no claim. rdmad runs on a fake cgroup2 tree
(tests/support/cgroup_tree.py): this host's kernel has no rdma controller."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from rdmad.model import RdmaLimit
from tests.cni.conftest import CniRig, running_rig
from tests.support.cgroup_tree import make_tree, written_line

POD = "kubepods/burstable/pod1"


@pytest.fixture
def cgroups(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "cgroup", POD)


@pytest.fixture
async def limited_rig(bus_address: str, tmp_path: Path, cgroups: Path) -> AsyncIterator[CniRig]:
    async with running_rig(bus_address, tmp_path, extra=["--cgroup-root", str(cgroups)]) as r:
        yield r


async def claims(rig: CniRig) -> int:
    return len(await rig.client.manager("ListClaims"))


async def test_add_writes_the_limit_and_del_lifts_it(
    limited_rig: CniRig, cgroups: Path, netns: str
) -> None:
    conf = limited_rig.conf(device="sim0", cgroup=POD, hcaHandles=1, hcaObjects=16)
    assert limited_rig.run("ADD", conf, netns).code == 0
    assert written_line(cgroups, POD, "sim0") == RdmaLimit(1, 16)
    assert limited_rig.run("DEL", conf, netns).code == 0
    assert written_line(cgroups, POD, "sim0") == RdmaLimit(None, None)


@pytest.mark.parametrize(
    ("keys", "error"),
    [
        ({"cgroup": "kubepods/burstable/pod2", "hcaHandles": 1}, 111),  # NoSuchCgroup
        ({"cgroup": "kubepods/../../escape", "hcaHandles": 1}, 109),  # InvalidArgs
        ({"hcaHandles": 1}, 7),  # no cgroup, no K8S_POD_UID
        ({"hcaObjects": 2**31 - 1}, 7),  # past what rdma.max keeps
    ],
    ids=["missing cgroup", "outside the mount", "no cgroup", "out of range"],
)
async def test_a_limit_that_cannot_apply_fails_the_add_and_claims_nothing(
    limited_rig: CniRig, netns: str, keys: dict[str, Any], error: int
) -> None:
    done = limited_rig.run("ADD", limited_rig.conf(device="sim0", **keys), netns)
    assert done.error == error, done
    assert await claims(limited_rig) == 0
    assert limited_rig.leases() == set()


async def test_a_pod_without_a_cgroup_on_the_host_is_no_such_cgroup(
    limited_rig: CniRig, netns: str
) -> None:
    """The pod's cgroup is looked for in the host's cgroup2 mount, where the kubelet made
    it; a UID that has none there fails the ADD."""
    args = "K8S_POD_UID=00000000-0000-4000-8000-00000000dead"
    done = limited_rig.run("ADD", limited_rig.conf(device="sim0", hcaHandles=1), netns, args=args)
    assert done.error == 111, done
    assert await claims(limited_rig) == 0
