"""Issue 37 through containerd's CRI on the real kernel (7.3 guest, rxe): a pod whose claim
asks for an RDMA limit, as the kubelet runs it under the cgroupfs driver.

The kubelet double makes the pod's cgroup (kubepods/burstable/pod<uid>) and gives it to
RunPodSandbox as the pod's cgroup_parent, as the kubelet does; the sandbox's CNI ADD runs
rdmad-cni with `hcaHandles: 1` and no cgroup, so the plugin finds the pod's cgroup from
K8S_POD_UID and rdmad writes the device's line into its rdma.max. In the pod's container
(the claim's CDI device, the host's rdma-core mounted read-only) ibv_rc_pingpong holds a
context while ibv_devinfo tries to open a second one: the kernel refuses it. The pod is
then stopped and removed, and the line is `max` again.

The kubelet's systemd driver is not run here: its cgroup_parent (a .slice) makes
containerd hand runc a systemd cgroup path, which needs systemd as PID 1 and the guest has
none. Both drivers' cgroup names are checked on the host (cni/cgroup_test.go,
tests/dra). The pod runs once for the module (fixture `run`); each test checks one thing
of that run. 7.3 only, as test_cri_rxe.py.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from rdmad.model import RdmaLimit
from testbed.cri.containerd import IMAGE, private_containerd, require_containerd
from testbed.cri.image import write_image_archive
from testbed.cri.kubelet import Kubelet
from testbed.cri.limited_pod import HOST_MOUNTS, SCRIPT, SCRIPT_TIMEOUT_S, LimitedPod
from testbed.daemon import Client, RdmadProcess
from tests.support.cgroup_tree import line
from tests.support.rdma import known_to_rdmad, temp_rxe

pytestmark = [
    pytest.mark.guest,
    pytest.mark.usefixtures("in_guest", "daemon_log_on_failure"),
]

log = logging.getLogger(__name__)  # each step of the run, for a guest run that times out

ADDRESS = "192.0.2.20/24"


@contextlib.contextmanager
def pod_cgroup(mount: Path, cgroup: str) -> Iterator[str]:
    """The pod's cgroup as the kubelet makes it before the sandbox, and removes it after."""
    path = mount / cgroup
    path.mkdir(parents=True)
    try:
        yield cgroup
    finally:
        for directory in (path, *list(path.parents)[: len(Path(cgroup).parts) - 1]):
            with contextlib.suppress(OSError):
                directory.rmdir()  # the pod's, then kubepods' own if nothing else is in them


def pod_network(rdmad: RdmadProcess, device: str) -> dict[str, Any]:
    ipam = {"type": "static", "addresses": [{"address": ADDRESS}]}
    return {
        "type": "rdmad",
        "device": device,
        "shared": True,
        "hcaHandles": 1,
        "busAddress": rdmad.bus_address,
        "ipam": ipam,
    }


@pytest.fixture(scope="module")
async def run(
    client: Client,
    rdmad: RdmadProcess,
    cgroup2: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[LimitedPod]:
    require_containerd()
    image = tmp_path_factory.mktemp("image") / "busybox.tar"
    write_image_archive(IMAGE, image)
    uid = str(uuid.uuid4())
    with (
        temp_rxe("cl") as rxe,
        pod_cgroup(cgroup2, f"kubepods/burstable/pod{uid}") as cgroup,
    ):
        await known_to_rdmad(client, rxe.name)
        async with private_containerd(rdmad.cdi_dir, "native") as containerd:
            containerd.add_network("rdmanet", [pod_network(rdmad, rxe.name)])
            kubelet = Kubelet(await containerd.start(image), containerd.pod_logs)
            log.info("containerd is up; RunPodSandbox in %s", cgroup)
            try:
                pod = await kubelet.run_pod("trainer-0", uid=uid, cgroup_parent=f"/{cgroup}")
            except BaseException as exc:
                exc.add_note("containerd log (tail):\n" + containerd.log()[-6000:])
                raise
            limit_running = line(cgroup, rxe.name)
            mounts = tuple(
                kubelet.cri.pb.Mount(container_path=d, host_path=d, readonly=True)
                for d in HOST_MOUNTS
            )
            container = await kubelet.run_container(
                pod, "app", cdi_devices=("rdmad.io/rdma=team.trainer-0.eth0",), mounts=mounts
            )
            log.info("the container runs; two contexts in it")
            done = await kubelet.exec(
                container, "/bin/sh", "-c", SCRIPT, timeout_s=SCRIPT_TIMEOUT_S
            )
            await kubelet.stop_pod(pod)
            await kubelet.remove_pod(pod)
            yield LimitedPod(
                rxe.name,
                cgroup,
                limit_running,
                done.stdout,
                list(await client.manager("ListClaims")),
                line(cgroup, rxe.name),
            )


async def test_the_sandboxs_cni_add_limits_the_pods_cgroup(run: LimitedPod) -> None:
    assert run.limit_running == RdmaLimit(1, None)


async def test_the_first_context_in_the_container_opens(run: LimitedPod) -> None:
    assert "local address" in run.section("first"), run.out


async def test_a_second_context_in_the_container_is_refused(run: LimitedPod) -> None:
    second = run.section("second")
    assert "exit=0" not in second and "Failed to open device" in second, run.out


async def test_after_the_pod_is_gone_the_limit_is_gone(run: LimitedPod) -> None:
    assert run.after == []
    assert run.limit_after == RdmaLimit()
