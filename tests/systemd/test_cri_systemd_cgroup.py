"""Issue 37 through containerd's CRI under the kubelet's systemd cgroup driver, in the systemd
check's guest (tests/guest/harness/run-systemd-check.sh): systemd is PID 1, rdmad is the
installed service on the system bus, the kernel is 7.3 with rxe0 (made at boot by the
check's set-up unit).

The same pod as tests/guest/test_cri_rdma_limits.py's (the cgroupfs driver), placed as that
driver places it: the kubelet double starts the pod's slice,
kubepods-besteffort-pod<uid, dashes as underscores>.slice, which systemd puts under
kubepods.slice/kubepods-besteffort.slice, and gives its name to RunPodSandbox as the pod's
cgroup_parent; containerd runs runc with SystemdCgroup = true, so the sandbox and the
container are scopes in that slice. The sandbox's CNI ADD runs the package's rdmad-cni with
`hcaHandles: 1` and no cgroup: the plugin finds the slice's cgroup from K8S_POD_UID. The
pod runs once for the module (fixture `run`); each test checks one thing of that run.
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rdmad.model import RdmaLimit
from testbed.cri.containerd import IMAGE, private_containerd, require_containerd
from testbed.cri.image import write_image_archive
from testbed.cri.kubelet import Kubelet
from testbed.cri.limited_pod import HOST_MOUNTS, SCRIPT, SCRIPT_TIMEOUT_S, LimitedPod
from testbed.daemon import Client
from tests.support.cgroup_tree import MOUNT, line

pytestmark = pytest.mark.guest

SYSTEM_BUS = "unix:path=/run/dbus/system_bus_socket"
DEVICE = "rxe0"  # the check's set-up unit makes it at boot
CDI_DIR = Path("/run/cdi")  # the installed rdmad's (its unit's RuntimeDirectory)
RDMAD_CNI = Path("/usr/lib/cni/rdmad")  # the package's
ADDRESS = "192.0.2.21/24"


@dataclass(frozen=True)
class SlicedPod(LimitedPod):
    scopes: list[str]  # the pod's slice's child cgroups while the container ran
    container_id: str


@contextlib.contextmanager
def pod_slice(uid: str) -> Iterator[tuple[str, str]]:
    """The pod's slice as the kubelet's systemd driver starts it before the sandbox (its
    parent slices come with it), and stops it after the pod is gone: (its name, its
    cgroup relative to the cgroup2 mount, as systemd placed it)."""
    unit = f"kubepods-besteffort-pod{uid.replace('-', '_')}.slice"
    subprocess.run(["systemctl", "start", unit], check=True)
    try:
        shown = subprocess.run(
            ["systemctl", "show", "-p", "ControlGroup", "--value", unit],
            check=True,
            capture_output=True,
            text=True,
        )
        yield unit, shown.stdout.strip().lstrip("/")
    finally:
        subprocess.run(["systemctl", "stop", unit], check=False)


def pod_network() -> dict[str, Any]:
    return {
        "type": "rdmad",
        "device": DEVICE,
        "shared": True,
        "hcaHandles": 1,
        "ipam": {"type": "static", "addresses": [{"address": ADDRESS}]},
    }


@pytest.fixture(scope="module")
async def run(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SlicedPod]:
    require_containerd()
    client = await Client.connect(SYSTEM_BUS, signals=False)
    image = tmp_path_factory.mktemp("image") / "busybox.tar"
    write_image_archive(IMAGE, image)
    uid = str(uuid.uuid4())
    with pod_slice(uid) as (unit, cgroup):
        # plain copies of a one-file image: no overlay module to count on in the guest
        async with private_containerd(
            CDI_DIR, "native", systemd_cgroup=True, cni=RDMAD_CNI
        ) as containerd:
            containerd.add_network("rdmanet", [pod_network()])
            kubelet = Kubelet(await containerd.start(image), containerd.pod_logs)
            try:
                pod = await kubelet.run_pod("trainer-0", uid=uid, cgroup_parent=unit)
            except BaseException as exc:
                exc.add_note("containerd log (tail):\n" + containerd.log()[-6000:])
                raise
            limit_running = line(cgroup, DEVICE)
            mounts = tuple(
                kubelet.cri.pb.Mount(container_path=d, host_path=d, readonly=True)
                for d in HOST_MOUNTS
            )
            container = await kubelet.run_container(
                pod, "app", cdi_devices=("rdmad.io/rdma=team.trainer-0.eth0",), mounts=mounts
            )
            done = await kubelet.exec(
                container, "/bin/sh", "-c", SCRIPT, timeout_s=SCRIPT_TIMEOUT_S
            )
            scopes = sorted(p.name for p in (MOUNT / cgroup).iterdir() if p.is_dir())
            await kubelet.stop_pod(pod)
            await kubelet.remove_pod(pod)
            yield SlicedPod(
                DEVICE,
                cgroup,
                limit_running,
                done.stdout,
                list(await client.manager("ListClaims")),
                line(cgroup, DEVICE),
                scopes,
                container.id,
            )
    client.bus.disconnect()


async def test_the_pods_slice_is_where_the_kubelet_puts_it(run: SlicedPod) -> None:
    slice_ = Path(run.cgroup).name
    assert run.cgroup == f"kubepods.slice/kubepods-besteffort.slice/{slice_}"


async def test_runc_puts_the_container_in_a_scope_of_the_pods_slice(run: SlicedPod) -> None:
    assert f"cri-containerd-{run.container_id}.scope" in run.scopes


async def test_the_sandboxs_cni_add_limits_the_pods_slice(run: SlicedPod) -> None:
    assert run.limit_running == RdmaLimit(1, None)


async def test_a_second_context_in_the_container_is_refused(run: SlicedPod) -> None:
    assert "local address" in run.section("first"), run.out
    second = run.section("second")
    assert "exit=0" not in second and "Failed to open device" in second, run.out


async def test_after_the_pod_is_gone_the_limit_is_gone(run: SlicedPod) -> None:
    assert run.after == []
    assert run.limit_after == RdmaLimit()
