"""rdmad-exporter against the real rdmad (sim RDMA on real veths), scraped over HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dbus_fast import Variant

from rdmad.model import RdmaLimit
from tests.e2e.test_stats import FRAMES, port1, quiet_up, send_frames, stats_json
from tests.support.cgroup_tree import make_tree, written_line
from tests.support.exporter import running_exporter
from tests.support.sim_rig import Rig, running_rig

SCRAPES = 1000
CLAIMS = 20  # claim/release cycles during the scrapes, each overlapping SCRAPES // CLAIMS
WARM_UP = 100
# Growth allowed over SCRAPES scrapes after warm-up: a leak of even 1 KiB per scrape fails.
RSS_GROWTH_KIB = 1024


async def test_output_passes_promtool_check_metrics(rig: Rig, netns: str) -> None:
    await rig.client.manager("Claim", "ssa{sv}", "sim0", netns, {"shared": Variant("b", True)})
    async with running_exporter(rig.daemon.bus_address) as exporter:
        text = await exporter.scrape_text()
    promtool = await asyncio.create_subprocess_exec(
        "promtool",
        "check",
        "metrics",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    said, _ = await asyncio.wait_for(promtool.communicate(text.encode()), 60)
    assert promtool.returncode == 0, said.decode()
    assert "rdmad_port_sent_pkts_total" in text and "rdmad_claim_info" in text


async def test_scrape_shows_the_same_counters_as_rdmactl(rig: Rig) -> None:
    pair = rig.nics["sim1"]
    await quiet_up(pair.host, pair.peer)
    send_frames(pair.host)
    async with running_exporter(rig.daemon.bus_address) as exporter:
        (entry,) = (await stats_json(rig, "sim1"))["devices"]
        samples = await exporter.scrape()
    labels = (("device", "sim1"), ("port", "1"))
    # nothing sends on sim1's veth but the test (IPv6 is off): the two reads agree
    assert samples[("rdmad_port_sent_pkts_total", labels)] == port1(entry)["sent_pkts"]
    assert port1(entry)["sent_pkts"] >= FRAMES
    assert samples[("rdmad_up", ())] == 1


async def test_claim_info_is_the_join_key_to_owners(rig: Rig, netns: str) -> None:
    opts = {"shared": Variant("b", True), "owner": Variant("s", "pod-a")}
    path = await rig.client.manager("Claim", "ssa{sv}", "sim0", netns, opts)
    claim_id = path.rsplit("/", 1)[1]
    async with running_exporter(rig.daemon.bus_address) as exporter:
        samples = await exporter.scrape()
    (info,) = [dict(k[1]) for k in samples if k[0] == "rdmad_claim_info"]
    assert info["claim"] == claim_id and info["owner"] == "pod-a"
    assert (info["device"], info["shared"], info["interface"]) == ("sim0", "true", "net1")
    assert samples[("rdmad_claims_total", ())] == 1
    assert samples[("rdmad_device_state", (("device", "sim0"), ("state", "shared")))] == 1


async def test_up_drops_to_zero_while_rdmad_is_stopped_and_comes_back(
    bus_address: str, tmp_path: Path
) -> None:
    async with running_rig(bus_address, tmp_path) as rig, running_exporter(bus_address) as exporter:
        assert (await exporter.scrape())[("rdmad_up", ())] == 1
        await rig.daemon.stop()
        down = await exporter.scrape()
        assert down[("rdmad_up", ())] == 0
        assert down[("rdmad_exporter_scrape_errors_total", ())] >= 1
        await rig.daemon.start()
        assert (await exporter.scrape())[("rdmad_up", ())] == 1


async def test_a_thousand_scrapes_while_claims_come_and_go_keep_rss_flat(
    rig: Rig, netns: str
) -> None:
    async def claim_and_release() -> None:
        opts = {"shared": Variant("b", True)}
        path = await rig.client.manager("Claim", "ssa{sv}", "sim0", netns, opts)
        await rig.client.manager("Release", "s", path.rsplit("/", 1)[1])

    async def scrapes_during_one_claim(times: int) -> list[str]:
        # the scrapes run on a worker thread while the claim comes and goes on the loop
        bodies, _ = await asyncio.gather(
            asyncio.to_thread(exporter.scrape_blocking, times), claim_and_release()
        )
        return bodies

    async with running_exporter(rig.daemon.bus_address) as exporter:
        # warm-up: imports, buffers, the D-Bus connection, a claim's metrics
        await scrapes_during_one_claim(WARM_UP)
        before = exporter.rss_kib()
        bodies = []
        for _ in range(CLAIMS):
            bodies += await scrapes_during_one_claim(SCRAPES // CLAIMS)
        after = exporter.rss_kib()
    assert len(bodies) == SCRAPES
    assert all("rdmad_up 1.0" in body for body in bodies)
    assert after - before < RSS_GROWTH_KIB, (before, after)


async def test_a_claims_rdma_usage_and_limit_are_joined_to_it_by_claim(
    bus_address: str, tmp_path: Path, netns: str
) -> None:
    """The real daemon on a tree shaped as a cgroup2 mount (tests/support/cgroup_tree.py):
    the limit it wrote and the usage the kernel would count, as the exporter and rdmactl
    stats show them."""
    cgroups = make_tree(tmp_path / "cgroup", "kubepods/pod1")
    (cgroups / "kubepods/pod1/rdma.current").write_text("sim0 hca_handle=1 hca_object=5\n")
    extra = ["--cgroup-root", str(cgroups)]
    async with running_rig(bus_address, tmp_path, extra=extra) as rig:
        opts = {
            "shared": Variant("b", True),
            "cgroup": Variant("s", str(cgroups / "kubepods/pod1")),
            "hca_handles": Variant("u", 2),
        }
        path = await rig.client.manager("Claim", "ssa{sv}", "sim0", netns, opts)
        claim_id = path.rsplit("/", 1)[1]
        assert written_line(cgroups, "kubepods/pod1", "sim0") == RdmaLimit(2, None)
        async with running_exporter(rig.daemon.bus_address) as exporter:
            samples = await exporter.scrape()
        (entry,) = (await stats_json(rig, claim_id))["claims"]
    at = (("cgroup", "kubepods/pod1"), ("claim", claim_id), ("device", "sim0"))
    handles, objects = (*at, ("resource", "hca_handle")), (*at, ("resource", "hca_object"))
    assert samples[("rdmad_claim_rdma_current", handles)] == 1
    assert samples[("rdmad_claim_rdma_current", objects)] == 5
    assert samples[("rdmad_claim_rdma_max", handles)] == 2
    assert ("rdmad_claim_rdma_max", objects) not in samples, "no limit: no sample"
    assert entry["rdma"] == {
        "cgroup": "kubepods/pod1",
        "current": {"hca_handle": 1, "hca_object": 5},
        "max": {"hca_handle": 2},
    }
