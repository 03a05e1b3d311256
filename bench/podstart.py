"""11. A pod's whole start through containerd 2 (testbed/cri) as the kubelet drives it, with
an RDMA device and without, on a real rdmad, rdmad-dra and the API server double. The pod
network is `ptp` with host-local IPAM, chained with rdmad-cni in pod mode. Three columns
take turns (bench.columns), settled:
  rdma:  NodePrepareResources on one channel held throughout (as the kubelet keeps one),
         RunPodSandbox, CreateContainer with the CDI device, StartContainer;
  plain: the same pod with no claim;
  raw:   the device's kernel operations by pyroute2 (bench.claim.Raw).
Each pod is stopped, removed and unprepared untimed. Target: what RDMA adds (rdma's p50
less plain's) at most TARGET times raw's p50, over the whole 95% interval.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench.claim import Raw
from bench.columns import Column, Samples, take_turns
from bench.common import SHM, Params, Results, Row, Settler, many_veths, ms_since, rdmad
from bench.dra import (
    DEVICE,
    IFNAME,
    REF,
    api_server,
    offers,
    published,
    put_claim,
    register,
    unprepare,
)
from bench.stats import bootstrap, pct, spread
from testbed.cri.containerd import IMAGE, private_containerd
from testbed.cri.image import write_image_archive
from testbed.cri.kubelet import Kubelet
from testbed.dra import kubelet as dra
from testbed.dra.apiserver import ApiServer
from testbed.dra.claims import POD_UID
from testbed.dra.plugin_process import running_plugin
from testbed.net import temp_netns

TARGET = 1.2  # what RDMA adds to a pod's start over the raw kernel operations, at p50
PLAIN_UID = "0b1e7c55-9a2d-4c3b-8f6e-2a4d5c6b7e80"


def network(bus: str, ipam_dir: Path) -> list[dict[str, Any]]:
    """The node's pod network: ptp, then rdmad-cni in pod mode."""
    ipam = {"type": "host-local", "subnet": "10.99.0.0/24", "dataDir": str(ipam_dir)}
    return [
        {"type": "ptp", "ipMasq": False, "ipam": ipam},
        {"type": "rdmad", "pod": True, "busAddress": bus},
    ]


def columns(n: Node, settle: Settler) -> list[Column]:
    kubelet = n.kubelet

    async def prepare() -> tuple[str, ...]:
        got = (await dra.prepare_devices_on(n.channel, n.service, [REF]))[REF.uid]
        if got.error or not got.devices:
            raise RuntimeError(f"NodePrepareResources failed: {got}")
        return tuple(got.devices[0].cdi_device_ids)

    async def start(s: Samples, name: str, uid: str, rdma: bool) -> None:
        await settle()
        t0 = time.perf_counter()
        cdi = await prepare() if rdma else ()
        pod = await kubelet.run_pod(name, "default", uid=uid)
        container = await kubelet.run_container(pod, "app", cdi_devices=cdi)
        s.add(name, ms_since(t0))
        if rdma:  # the pod has its device (exec fails if not)
            await kubelet.exec(container, "/bin/ip", "-o", "link", "show", IFNAME)
        await kubelet.stop_pod(pod)
        await kubelet.remove_pod(pod)
        if rdma:
            await unprepare(n.endpoint, n.service)
            await published(n.api, offers(DEVICE, whole=True))

    async def moved(s: Samples) -> None:
        await settle()
        t0 = time.perf_counter()
        await n.raw.claim()
        s.add("raw", ms_since(t0))
        await n.raw.release()

    return [
        lambda s: start(s, "rdma", POD_UID, True),
        lambda s: start(s, "plain", PLAIN_UID, False),
        moved,
    ]


@dataclass
class Node:
    """The node a pod starts on: the kubelet (the CRI client), the API server double, the
    plugin's DRA service on one channel held throughout (as the kubelet keeps one
    connection to a plugin), and the raw column's kernel operations."""

    kubelet: Kubelet
    api: ApiServer
    channel: grpc.aio.Channel
    endpoint: str
    service: str
    raw: Raw


@contextlib.asynccontextmanager
async def node(bus: str) -> AsyncIterator[Node]:
    with (
        many_veths(1, "p", up=True) as nics,
        many_veths(1, "q", up=True) as spare,
        temp_netns("rbq") as raw_netns,
        tempfile.TemporaryDirectory(prefix="rdmad-bench-pod-", dir=SHM) as tmp,
        api_server() as api,
    ):
        workdir = Path(tmp)
        put_claim(api)
        write_image_archive(IMAGE, workdir / "image.tar")
        async with (
            rdmad(bus, nics.sim_spec()) as daemon,
            running_plugin(api, bus, workdir / "dra") as plugin,
            private_containerd(daemon.cdi_dir) as containerd,
            Raw(spare.hosts[0], raw_netns) as raw,
        ):
            endpoint, service = await register(plugin)
            containerd.add_network("bench", network(bus, workdir / "ipam"))
            kubelet = Kubelet(await containerd.start(workdir / "image.tar"), containerd.pod_logs)
            await published(api, offers(DEVICE, whole=True))
            async with dra.connect(endpoint) as channel:
                yield Node(kubelet, api, channel, endpoint, service, raw)


async def run(bus: str, p: Params, res: Results, out: Path) -> None:
    del out  # rows only
    async with node(bus) as n:
        t = (await take_turns(columns(n, Settler(p)), p.cni_reps, p.warmup)).t
    report(res, t["rdma"], t["plain"], t["raw"])


def added_over_raw(rdma: list[float], plain: list[float], raw: list[float]) -> float:
    return (pct(rdma, 50) - pct(plain, 50)) / pct(raw, 50)


def report(res: Results, rdma: list[float], plain: list[float], raw: list[float]) -> None:
    lo, hi = bootstrap(added_over_raw, rdma, plain, raw)
    added = pct(rdma, 50) - pct(plain, 50)
    res.rows.append(
        Row(
            f"11. A pod's start through containerd 2 ({len(rdma)} pods each): prepare, sandbox"
            " (ptp, rdmad-cni in pod mode), a container with the CDI device, started; against"
            " the same pod without RDMA",
            spread(rdma),
            f"without RDMA {spread(plain)}; raw move {spread(raw)}",
            "-",
            f"RDMA adds {added:.1f} ms at p50; over raw's p50"
            f" {added_over_raw(rdma, plain, raw):.2f} ({lo:.2f}-{hi:.2f})",
            f"what RDMA adds <= {TARGET:g}x raw at p50",
            hi <= TARGET,
        )
    )
    res.dists["Pod start: with RDMA"] = rdma
    res.dists["Pod start: without RDMA"] = plain
