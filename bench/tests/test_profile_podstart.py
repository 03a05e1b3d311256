"""The pod-start profile's reading of perf's events (no root, no perf)."""

from __future__ import annotations

from bench.profile_podstart import runs

SCRIPT = """\
      containerd 100/101 10.000000: sched:sched_process_fork: comm=containerd pid=101 child_comm=containerd child_pid=200
             ptp 200/200 10.001000: sched:sched_process_exec: filename=/cni-bin/ptp pid=200 old_pid=200
             ptp 200/201 10.010000: sched:sched_process_exit: comm=ptp pid=201 prio=120 group_dead=false
             ptp 200/200 10.020000: sched:sched_process_exit: comm=ptp pid=200 prio=120 group_dead=true
           rdmad 300/300 10.021000: sched:sched_process_exec: filename=/cni-bin/rdmad pid=300 old_pid=300
           rdmad 300/300 10.031000: sched:sched_process_exit: comm=rdmad pid=300 prio=120 group_dead=true
"""  # noqa: E501


def test_a_run_is_an_exec_to_the_exit_of_its_whole_process_by_executable_name() -> None:
    assert runs(SCRIPT) == [("ptp", 10.001, 10.02), ("rdmad", 10.021, 10.031)]
