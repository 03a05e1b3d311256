"""bench.ktrace reads each operation's kernel move out of an ftrace log."""

from __future__ import annotations

from bench.ktrace import longest_sends

# The shape of /sys/kernel/tracing/trace with syscall events and markers (6.18).
TRACE = """\
# tracer: nop
          python-100     [000] ..... 10.000000: tracing_mark_write: B rc1
          python-100     [000] ..... 10.000100: sys_sendto(fd: 8, buff: 0x1, len: 0x20)
          python-100     [000] ..... 10.000150: sys_sendto -> 0x20
   rdmad-netns_0-205     [001] ..... 10.001000: sys_sendto(fd: 9, buff: 0x1, len: 0x34)
          python-100     [000] ..... 10.001200: sys_sendto(fd: 8, buff: 0x1, len: 0x20)
          python-100     [000] ..... 10.001300: sys_sendto -> 0x20
   rdmad-netns_0-205     [001] ..... 10.017000: sys_sendto -> 0x34
          python-100     [000] ..... 10.020000: tracing_mark_write: E rc1
              ip-300     [000] ..... 10.030000: sys_sendmsg(fd: 3, msg: 0x1, flags: 0)
              ip-300     [000] ..... 10.043000: sys_sendmsg -> 0x6c
          python-100     [000] ..... 10.050000: tracing_mark_write: B cc1
              ip-301     [001] ..... 10.051000: sys_sendmsg(fd: 3, msg: 0x1, flags: 0)
              ip-301     [001] ..... 10.063500: sys_sendmsg -> 0x6c
          python-100     [000] ..... 10.070000: tracing_mark_write: E cc1
"""


def test_each_operation_gets_its_longest_send_from_any_thread_or_process() -> None:
    moves = longest_sends(TRACE.splitlines())
    assert moves.keys() == {"rc1", "cc1"}
    assert abs(moves["rc1"] - 16.0) < 1e-6  # the worker thread's move, not the loop's sends
    assert abs(moves["cc1"] - 12.5) < 1e-6


def test_sends_outside_any_operation_are_ignored() -> None:
    # the ip move at 10.030 falls between rc1 and cc1
    assert 13.0 not in {round(v, 3) for v in longest_sends(TRACE.splitlines()).values()}
