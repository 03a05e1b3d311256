"""The RDMA netns mode through rdmad, against the real kernel's `rdma system`.

The kernel refuses a mode change while any netns besides init_net exists (EBUSY), and a
deleted netns dies asynchronously: the test that leaves one behind runs last here, and
every switch goes through `set_netns_mode`, which waits out a dying netns.
"""

from __future__ import annotations

import pytest

from testbed.daemon import Client, DBusCallError
from tests.support.rdma import rdma_netns_mode, set_netns_mode

pytestmark = [
    pytest.mark.guest,
    pytest.mark.usefixtures("in_guest", "daemon_log_on_failure"),
]


async def test_netns_mode_matches_rdma_system(client: Client) -> None:
    assert await client.prop("/io/rdmad1", "io.rdmad1.Manager", "NetnsMode") == rdma_netns_mode()
    assert rdma_netns_mode() == "shared", "the guest boots in the kernel's default mode"


async def test_set_exclusive_with_no_other_netns_then_back_to_shared(client: Client) -> None:
    await set_netns_mode(client, "exclusive")
    try:
        assert rdma_netns_mode() == "exclusive"
        assert await client.prop("/io/rdmad1", "io.rdmad1.Manager", "NetnsMode") == "exclusive"
    finally:
        await set_netns_mode(client, "shared")
    assert rdma_netns_mode() == "shared"
    assert await client.prop("/io/rdmad1", "io.rdmad1.Manager", "NetnsMode") == "shared"


async def test_mode_change_is_announced_as_properties_changed(client: Client) -> None:
    mark = client.mark()
    await set_netns_mode(client, "exclusive")
    try:
        changed = await client.wait_signal(
            "PropertiesChanged", lambda b: "NetnsMode" in b[1], since=mark
        )
        assert changed[1]["NetnsMode"].value == "exclusive"
    finally:
        await set_netns_mode(client, "shared")


# Last in this module: the netns dies asynchronously after the test, and until it has gone
# the kernel keeps refusing mode changes.
async def test_set_exclusive_while_another_netns_exists_is_mode_busy(
    client: Client, netns: str
) -> None:
    with pytest.raises(DBusCallError) as err:
        await client.manager("SetNetnsMode", "s", "exclusive")
    assert err.value.name == "io.rdmad1.Error.ModeBusy"
    assert "other network namespaces" in err.value.message
    assert await client.prop("/io/rdmad1", "io.rdmad1.Manager", "NetnsMode") == "shared"
    assert rdma_netns_mode() == "shared"
