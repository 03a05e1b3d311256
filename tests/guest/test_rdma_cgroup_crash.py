"""rdmad SIGKILLed (os._exit at the step, testbed/faulty_rdmad.py) right after it
wrote a claim's limit into the kernel's rdma.max and before the claim's record says it is
done: the restart undoes the claim, and the line is back at max."""

from __future__ import annotations

import pytest
from dbus_fast import Variant

from rdmad.model import RdmaLimit
from testbed.daemon import Client, DBusCallError, RdmadProcess
from testbed.faulty_rdmad import CRASH_AT, CRASH_EXIT
from testbed.net import link
from tests.support.cgroup_tree import line
from tests.support.rdma import Rxe, known_to_rdmad

DAEMON_START_S = 180.0  # as tests/guest/conftest.py's: imports over 9p under TCG
pytestmark = [
    pytest.mark.guest,
    pytest.mark.on_61,  # the rdma controller of both kernels
    pytest.mark.usefixtures("in_guest", "daemon_log_on_failure"),
]


@pytest.fixture(scope="module")
def daemon_env() -> dict[str, str]:
    return {CRASH_AT: "limit-written"}


async def test_a_kill_after_the_limit_is_written_leaves_no_claim_and_no_limit(
    rdmad: RdmadProcess, netns: str, rxe: Rxe, cgroup: str
) -> None:
    client = await Client.connect(rdmad.bus_address)
    try:
        await known_to_rdmad(client, rxe.name)
        options = {
            "shared": Variant("b", True),
            "ifname": Variant("s", "net1"),
            "cgroup": Variant("s", cgroup),
            "hca_handles": Variant("u", 1),
        }
        with pytest.raises(DBusCallError):
            await client.manager("Claim", "ssa{sv}", rxe.name, netns, options)
    finally:
        client.close()
    assert rdmad.proc is not None
    assert await rdmad.proc.wait() == CRASH_EXIT
    assert line(cgroup, rxe.name) == RdmaLimit(1, None), "killed after the write"
    await rdmad.kill()
    await rdmad.start(timeout=DAEMON_START_S)
    client = await Client.connect(rdmad.bus_address)
    try:
        assert await client.manager("ListClaims") == []
    finally:
        client.close()
    assert line(cgroup, rxe.name) == RdmaLimit()
    assert link("net1", netns) is None, "the claim's macvlan child is undone too"
