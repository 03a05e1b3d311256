"""The rdmad-dra scenario's plan, predicates and verdicts (no root, no daemon, no plugin)."""

from __future__ import annotations

from bench.common import Idle
from bench.dra import DEVICE, cni_confs, lacks, offers, p99_met, pod_args
from testbed.threads import Thread, woken


def device(rdma: str, name: str) -> dict[str, dict[str, object]]:
    return {name: {"name": name, "attributes": {"rdmaDevice": {"string": rdma}}}}


def test_the_pod_mode_conf_is_chained_and_names_no_device() -> None:
    confs = cni_confs("unix:path=/bus", "ns1")
    assert confs["pod"]["prevResult"]["interfaces"][0]["sandbox"] == "/run/netns/ns1"
    assert confs["pod"]["pod"] is True and "device" not in confs["pod"]
    assert confs["by name"]["device"] == DEVICE and "pod" not in confs["by name"]


def test_the_pods_cni_args_carry_its_uid() -> None:
    assert "K8S_POD_UID=abc" in pod_args("abc").split(";")


def test_a_device_is_offered_whole_or_as_a_share_slot() -> None:
    slot = device("sim1", "sim1--share-0")
    assert offers("sim1")(slot) and not offers("sim1", whole=True)(slot)
    assert offers("sim1", whole=True)(device("sim1", "sim1"))
    assert not offers("sim1")(device("sim0", "sim0"))


def test_a_device_held_whole_lacks_from_the_pool_even_with_a_slot_left() -> None:
    assert lacks("sim0")(device("sim0", "sim0--share-0"))
    assert not lacks("sim0")(device("sim0", "sim0"))


def test_a_pool_being_rewritten_shows_no_device_lacking() -> None:
    # until all its slices are written the scheduler, and the double, see none of it
    assert not lacks("sim0")({})


def test_wakeups_are_counted_per_thread_and_a_thread_born_meanwhile_counts_whole() -> None:
    loop, lifeguard, timer = Thread("python3", 10), Thread("lifeguard", 12), Thread("timer", 13)
    before = {loop: 40, lifeguard: 7}
    after = {loop: 40, lifeguard: 9, timer: 3}
    assert woken(before, after) == {lifeguard: 2, timer: 3}


def test_idle_is_met_only_with_no_cpu_and_no_wakeup() -> None:
    assert Idle(60.0, 0.0, {}).met
    assert not Idle(60.0, 0.0, {Thread("lifeguard", 12): 1}).met
    assert not Idle(60.0, 10.0, {}).met


def test_idle_wakeups_are_summed_by_thread_name() -> None:
    wakeups = {
        Thread("event_engine", 21): 30,
        Thread("event_engine", 22): 12,
        Thread("lifeguard", 23): 60,
    }
    text = Idle(60.0, 0.0, wakeups).text()
    assert text == "CPU 0 ms, 102 wake-ups (event_engine 42, lifeguard 60) in 60 s"


def test_the_hotplug_target_needs_the_whole_p99_interval_under_a_second() -> None:
    assert p99_met([50.0] * 199 + [900.0])
    assert not p99_met([50.0] * 190 + [1200.0] * 10)
