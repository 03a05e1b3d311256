"""rdmad-dra from its image (`make image`), run as its DaemonSet's pod spec runs it, through
containerd's CRI: the image imported with `ctr images import`, a hostNetwork pod whose
container runs the image's entrypoint with NODE_NAME set and the host's paths bound in (the
kubelet's plugin registry and plugins dirs, /var/run/cdi, the system bus socket). The
kubelet double finds its registration socket as the kubelet's plugin watcher does, takes the
DRA endpoint GetInfo names, and prepares a claim there; a pod then runs with the held device
and is taken down, and the device comes home."""

from __future__ import annotations

import json
import os
import re
import tarfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testbed.cri.kubelet import Container, Kubelet
from testbed.daemon import ROOT
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
# The DaemonSet's mounts (deploy/kubernetes/daemonset.yaml): host path = container path.
REGISTRY = Path("/var/lib/kubelet/plugins_registry")
PLUGINS = Path("/var/lib/kubelet/plugins")
CDI = Path("/var/run/cdi")
SYSTEM_BUS = Path("/run/dbus/system_bus_socket")
# The test's own: a DaemonSet's pod reaches its API server with its service account.
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


def _mount(kubelet: Kubelet, host: Path, container: Path) -> object:
    return kubelet.cri.pb.Mount(host_path=str(host), container_path=str(container))


def _bus_socket(address: str) -> Path:
    match = re.search(r"(?:^|[:;,])path=([^,;]+)", address)
    assert match, f"no socket path in {address}"
    return Path(match[1])


async def plugin_from_image(
    node: Node, kubelet: Kubelet, api: ApiServer, image: str, workdir: Path
) -> ImagePlugin:
    """The plugin's pod and container, as the DaemonSet's pod spec makes them, once its
    registration socket answers GetInfo."""
    host = {REGISTRY: workdir / "plugins_registry", PLUGINS: workdir / "plugins"}
    for directory in host.values():
        directory.mkdir(parents=True)
    host[CDI] = node.rig.daemon.cdi_dir
    host[SYSTEM_BUS] = _bus_socket(node.rig.daemon.bus_address)
    host[KUBECONFIG] = api.kubeconfig(workdir)
    await node.containerd.import_image(ARCHIVE)
    pod = await kubelet.run_pod("rdmad-dra-x7k2p", "kube-system", host_network=True)
    container = await kubelet.run_container(
        pod,
        "rdmad-dra",
        command=(),
        image=image,
        args=("--kubeconfig", str(KUBECONFIG), "--driver-name", api.driver),
        env={"NODE_NAME": api.node},
        mounts=tuple(_mount(kubelet, h, c) for c, h in host.items()),
    )
    log = kubelet.logs / f"{pod.namespace}_{pod.name}_{pod.uid}" / "rdmad-dra" / "0.log"
    await eventually(
        lambda: log.exists() and "serving DRA driver" in log.read_text(errors="replace"),
        START_S,
        f"rdmad-dra's 'serving' line in {log}",
    )
    (socket,) = dra.registration_sockets(str(host[REGISTRY]))
    info = await dra.get_info(socket)
    assert (info.type, info.name) == (dra.DRA_TYPE, api.driver), info
    await dra.notify_registration_status(socket, True)
    endpoint = host[PLUGINS] / Path(info.endpoint).relative_to(PLUGINS)
    return ImagePlugin(container, endpoint)


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
    plugin = await plugin_from_image(node, kubelet, api, image, tmp_path / "dra")
    await api.wait_for(lambda devices: "sim0" in devices)
    prepared = await prepare(api, plugin, "sim0")
    pod, container = await run_prepared_pod(kubelet, prepared)
    assert "rdma0" in (await kubelet.exec(container, "/bin/ip", "-o", "link")).stdout
    assert await char_devices(kubelet, container) == spec_nodes(node, prepared.hold_id)
    await take_down_and_unprepare(kubelet, pod, plugin, prepared)
    await assert_home(node, "sim0")
