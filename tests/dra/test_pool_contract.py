"""Contract tests: the node's pool, written through the kubernetes client to the loopback
API server, which validates each slice against the client's V1ResourceSlice and the API's
limits (the `api` fixture fails a test that sent one it refused)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from rdmad.dra.kube import KubeSliceApi, api_client
from rdmad.dra.slices import PORT_DOWN, Backoff, Pool, SlicePublisher
from testbed.dra.apiserver import ApiServer
from tests.dra.test_offer import offer, props


def pool_on(api: ApiServer, tmp_path: Path, sharing: str = "auto") -> Pool:
    kube = KubeSliceApi(api_client(str(api.kubeconfig(tmp_path))))
    return Pool(kube, api.driver, api.node, sharing)


@pytest.fixture
def pool(api: ApiServer, tmp_path: Path) -> Pool:
    return pool_on(api, tmp_path)


def devices(n: int) -> list[dict[str, Any]]:
    return offer(*[props(f"mlx5_{i}") for i in range(n)], mode="exclusive")


def test_one_slice_names_the_node_as_pool_and_owner(api: ApiServer, pool: Pool) -> None:
    assert pool.sync(devices(2))
    (s,) = api.slices.values()
    assert s["spec"]["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    assert s["spec"]["nodeName"] == "node-a" and s["spec"]["driver"] == "rdma.rdmad.io"
    (owner,) = s["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Node", "node-a", api.node_uid)
    assert sorted(api.devices()) == ["mlx5-0", "mlx5-1"]


def test_an_unchanged_offer_writes_nothing(api: ApiServer, pool: Pool) -> None:
    pool.sync(devices(2))
    writes = api.writes
    assert not pool.sync(devices(2))
    assert api.writes == writes


def test_300_devices_take_three_slices_of_one_generation(api: ApiServer, pool: Pool) -> None:
    pool.sync(devices(300))
    pools = [s["spec"]["pool"] for s in api.slices.values()]
    assert sorted(len(s["spec"]["devices"]) for s in api.slices.values()) == [44, 128, 128]
    assert {(p["generation"], p["resourceSliceCount"]) for p in pools} == {(1, 3)}
    assert len(api.devices()) == 300


def test_a_shrinking_pool_deletes_its_extra_slices_under_a_new_generation(
    api: ApiServer, pool: Pool
) -> None:
    pool.sync(devices(300))
    pool.sync(devices(1))
    (s,) = api.slices.values()
    assert s["spec"]["pool"] == {"name": "node-a", "generation": 2, "resourceSliceCount": 1}
    assert list(api.devices()) == ["mlx5-0"]


def test_no_device_is_one_empty_slice(api: ApiServer, pool: Pool) -> None:
    pool.sync(devices(2))
    pool.sync([])
    (s,) = api.slices.values()
    assert s["spec"]["devices"] == [] and s["spec"]["pool"]["resourceSliceCount"] == 1


def test_slices_someone_else_deleted_are_made_again(api: ApiServer, pool: Pool) -> None:
    pool.sync(devices(2))
    api.slices.clear()  # as the kubelet wipes a node's slices when it starts
    assert pool.sync(devices(2))
    assert sorted(api.devices()) == ["mlx5-0", "mlx5-1"]


def test_a_node_made_again_under_its_name_owns_the_slices_anew(api: ApiServer, pool: Pool) -> None:
    pool.sync(devices(2))
    api.node_uid = "7e7b1f4a-0000-4000-8000-000000000001"  # deleted and registered again
    assert pool.sync(devices(2))
    (s,) = api.slices.values()
    assert [o["uid"] for o in s["metadata"]["ownerReferences"]] == [api.node_uid]


@pytest.mark.parametrize(
    ("version", "sharing", "partitions"),
    [
        ((1, 36), "auto", True),
        ((1, 37), "auto", True),
        ((1, 35), "auto", False),
        ((1, 34), "auto", False),
        ((1, 35), "counters", True),
        ((1, 37), "slots", False),
    ],
)
def test_slots_are_partitions_on_1_36_and_newer_or_as_the_flag_says(
    api: ApiServer,
    tmp_path: Path,
    version: tuple[int, int],
    sharing: str,
    partitions: bool,
) -> None:
    api.version = version
    pool_on(api, tmp_path, sharing).sync(offer(props("mlx5_0"), limit=2))
    assert sorted(api.devices()) == ["mlx5-0", "mlx5-0--share-0", "mlx5-0--share-1"]
    consumes = [d.get("consumesCounters") for d in api.devices().values()]
    if partitions:
        assert api.counter_sets() == {
            "mlx5-0": {"name": "mlx5-0", "counters": {"shares": {"value": "2"}}}
        }
        assert all(consumes)
    else:
        assert api.counter_sets() == {} and not any(consumes)


def test_counter_sets_and_devices_are_slices_of_one_generation(
    api: ApiServer, tmp_path: Path
) -> None:
    pool_on(api, tmp_path).sync(offer(*[props(f"mlx5_{i}") for i in range(9)], limit=16))
    specs = [s["spec"] for s in api.slices.values()]
    assert sorted(("sharedCounters" in s, len(s.get("devices", []))) for s in specs) == [
        (False, 25),
        (False, 64),
        (False, 64),
        (True, 0),
        (True, 0),
    ]
    assert {(s["pool"]["generation"], s["pool"]["resourceSliceCount"]) for s in specs} == {(1, 5)}
    assert len(api.counter_sets()) == 9


def test_unchanged_partitions_write_nothing(api: ApiServer, pool: Pool) -> None:
    pool.sync(offer(props("mlx5_0"), limit=2))
    writes = api.writes
    assert not pool.sync(offer(props("mlx5_0"), limit=2))
    assert api.writes == writes


@contextlib.asynccontextmanager
async def publishing(pool: Pool, backoff: Backoff) -> AsyncIterator[SlicePublisher]:
    publisher = SlicePublisher(pool, backoff)
    task = asyncio.ensure_future(publisher.run())
    try:
        yield publisher
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_api_errors_are_retried_after_backoff_with_the_newest_offer(
    api: ApiServer, pool: Pool
) -> None:
    api.fail_writes = 3
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with publishing(pool, Backoff(initial=0.2, factor=2, cap=1)) as publisher:
        publisher.offer(devices(1))
        publisher.offer(devices(3))  # the newest offer wins, once the API server is back
        await api.wait_for(lambda d: len(d) == 3)
    # 0.2 + 0.4 + 0.8 s of backoff between the four tries: no busy loop
    assert loop.time() - start >= 1.4
    assert api.fail_writes == 0 and api.writes == 1


def tainted_pool(api: ApiServer, tmp_path: Path) -> Pool:
    kube = KubeSliceApi(api_client(str(api.kubeconfig(tmp_path))))
    return Pool(kube, api.driver, api.node, taint="NoSchedule")


def test_while_tainting_is_on_a_slice_holds_at_most_64_devices(
    api: ApiServer, tmp_path: Path
) -> None:
    tainted_pool(api, tmp_path).sync(devices(100))
    assert sorted(len(s["spec"]["devices"]) for s in api.slices.values()) == [36, 64]


def test_a_taint_the_api_server_stamped_is_no_change(api: ApiServer, tmp_path: Path) -> None:
    pool = tainted_pool(api, tmp_path)
    offer = devices(2)
    offer[0] = {
        **offer[0],
        "taints": [{"key": PORT_DOWN, "value": "DOWN", "effect": "NoSchedule"}],
    }
    assert pool.sync(offer)
    assert "timeAdded" in api.devices()["mlx5-0"]["taints"][0]
    writes = api.writes
    assert not pool.sync(offer)
    assert api.writes == writes
