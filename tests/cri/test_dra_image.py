"""rdmad-dra from its image (`make image`), run as its DaemonSet's pod spec runs it, through
containerd's CRI: the image imported with `ctr images import`, a pod with the DaemonSet's
hostNetwork whose container runs the image's entrypoint with the DaemonSet's args, its
downward-API environment (NODE_NAME, POD_UID) and exactly its mounts
(deploy/kubernetes/daemonset.yaml, read through testbed/dra/daemonset.py), each host path
relocated under the test's own directories. The kubelet double finds its registration socket
as the kubelet's plugin watcher does, takes the DRA endpoint GetInfo names, and prepares a
claim there; a pod then runs with the held device and is taken down, and the device comes
home."""

from __future__ import annotations

import json
import os
import re
import tarfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rdmad.dra.plugin import DEFAULT_REGISTRAR_DIR
from testbed.cri.kubelet import Container, Kubelet
from testbed.daemon import ROOT
from testbed.dra import daemonset
from testbed.dra import kubelet as dra
from testbed.dra.apiserver import ApiServer
from testbed.dra.claims import DRIVER, NODE
from testbed.net import eventually
from tests.cri.conftest import Node
from tests.cri.test_containerd import char_devices, spec_nodes
from tests.cri.test_dra_pod import (
    assert_home,
    prepare,
    run_prepared_pod,
    take_down_and_unprepare,
)

ARCHIVE = ROOT / "build" / "image" / "rdmad-dra.oci.tar"
# The one mount that is the test's own: a DaemonSet's pod reaches its API server through the
# service account Kubernetes mounts into every pod; the API server double's kubeconfig
# stands for it.
KUBECONFIG = Path("/etc/rdmad-dra/kubeconfig")
START_S = 120.0  # the image's first start compiles nothing, but imports the whole client


@pytest.fixture(scope="session")
def image() -> str:
    """The image's reference, as `make image` named it in the archive."""
    if not ARCHIVE.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no {ARCHIVE} (make image), and CI=true is set")
        pytest.skip(f"needs {ARCHIVE}: make image")
    with tarfile.open(ARCHIVE) as tar:
        index = tar.extractfile("./index.json")
        assert index is not None
        (manifest,) = json.load(index)["manifests"]
    return str(manifest["annotations"]["io.containerd.image.name"])


@dataclass
class ImagePlugin:
    """rdmad-dra in its container: `endpoint` is the host's path of the DRA socket its
    GetInfo names."""

    container: Container
    endpoint: Path


def _bus_socket(address: str) -> Path:
    match = re.search(r"(?:^|[:;,])path=([^,;]+)", address)
    assert match, f"no socket path in {address}"
    return Path(match[1])


def host_paths(node: Node) -> dict[str, Path]:
    """Where each of the DaemonSet's host paths is on this test's node: the kubelet's
    directories under the node's containerd home (short: the plugin's socket names, its
    pod's UID in them, must fit in sun_path), the system bus's directory that of the rig's
    private bus (its socket is named as the system bus's), the host's cgroup2 mount itself."""
    home = node.containerd.home
    return {
        "/var/lib/kubelet/plugins_registry": home / "registry",
        "/var/lib/kubelet/plugins/rdma.rdmad.io": home / "plugin",
        "/run/dbus": _bus_socket(node.rig.daemon.bus_address).parent,
        "/sys/fs/cgroup": Path("/sys/fs/cgroup"),
    }


def on_host(mounts: list[daemonset.Mount], host: dict[str, Path], path: str) -> Path:
    """The host's path of `path` in the container, through the mount it lies under."""
    for m in mounts:
        if Path(path).is_relative_to(m.container):
            return host[m.host] / Path(path).relative_to(m.container)
    raise AssertionError(f"{path} is under none of the DaemonSet's mounts")


async def plugin_from_image(
    node: Node, kubelet: Kubelet, api: ApiServer, image: str, workdir: Path
) -> ImagePlugin:
    """The plugin's pod and container, as the DaemonSet's pod spec makes them, once its
    registration socket answers GetInfo."""
    mounts, host = daemonset.mounts(), host_paths(node)
    assert {m.host for m in mounts} == set(host), "a DaemonSet mount this test cannot place"
    for m in mounts:
        host[m.host].mkdir(parents=True, exist_ok=True)
    pb = kubelet.cri.pb
    binds = [
        pb.Mount(host_path=str(host[m.host]), container_path=m.container, readonly=m.read_only)
        for m in mounts
    ]
    binds.append(pb.Mount(host_path=str(api.kubeconfig(workdir)), container_path=str(KUBECONFIG)))
    await node.containerd.import_image(ARCHIVE)
    pod = await kubelet.run_pod(
        "rdmad-dra-x7k2p", "kube-system", host_network=daemonset.pod_spec()["hostNetwork"]
    )
    fields = {"spec.nodeName": api.node, "metadata.uid": pod.uid}
    container = await kubelet.run_container(
        pod,
        "rdmad-dra",
        command=(),
        image=image,
        args=(*daemonset.container()["args"], "--kubeconfig", str(KUBECONFIG)),
        env={name: fields[field] for name, field in daemonset.downward_env().items()},
        mounts=tuple(binds),
    )
    log = kubelet.logs / f"{pod.namespace}_{pod.name}_{pod.uid}" / "rdmad-dra" / "0.log"
    await eventually(
        lambda: log.exists() and "serving DRA driver" in log.read_text(errors="replace"),
        START_S,
        f"rdmad-dra's 'serving' line in {log}",
    )
    registry = on_host(mounts, host, DEFAULT_REGISTRAR_DIR)
    (socket,) = dra.registration_sockets(str(registry))
    info = await dra.get_info(socket)
    assert (info.type, info.name) == (dra.DRA_TYPE, api.driver), info
    await dra.notify_registration_status(socket, True)
    return ImagePlugin(container, on_host(mounts, host, info.endpoint))


@pytest.fixture
async def api() -> AsyncIterator[ApiServer]:
    server = ApiServer(NODE, DRIVER)
    with server.running():
        yield server
    assert server.invalid == [], "the plugin sent slices the API server refuses"


async def test_rdmad_dra_from_its_image_prepares_a_pod_that_runs_with_its_device(
    node: Node, api: ApiServer, image: str, tmp_path: Path
) -> None:
    kubelet = await node.start(node.rdmad(device="sim1"), node.rdmad(pod=True, ipam=None))
    plugin = await plugin_from_image(node, kubelet, api, image, tmp_path)
    await api.wait_for(lambda devices: "sim0" in devices)
    prepared = await prepare(api, plugin, "sim0")
    pod, container = await run_prepared_pod(kubelet, prepared)
    assert "rdma0" in (await kubelet.exec(container, "/bin/ip", "-o", "link")).stdout
    assert await char_devices(kubelet, container) == spec_nodes(node, prepared.hold_id)
    await take_down_and_unprepare(kubelet, pod, plugin, prepared)
    await assert_home(node, "sim0")
