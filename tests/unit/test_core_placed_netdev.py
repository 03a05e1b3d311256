"""A claim's netdev as its user sees it in the netns (its MAC, its addresses as CIDRs, which
the bus shows as the claim's MacAddress and Addresses): read after the claim's steps, and
again when an address changes on it there, the pod's own changes included; the real Core
on the in-memory kernel."""

from __future__ import annotations

import ipaddress

from rdmad.model import ClaimOptions
from tests.support.core_rig import Rigs, two_nics

SHARED = ClaimOptions(
    shared=True, ifname="net1", addresses=(ipaddress.ip_interface("198.51.100.5/24"),)
)


async def test_a_claim_records_its_netdevs_mac_and_addresses(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    child = kernel.link("net1", "pod")
    assert child is not None and claim.attachment is not None
    assert (claim.attachment.ns_mac, claim.attachment.ns_addresses) == (
        child.mac,
        ("198.51.100.5/24",),
    )


async def test_a_prefix_the_pod_changes_shows_in_the_claims_addresses(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    kernel.set_addresses("net1", ("198.51.100.5/26", "2001:db8::5/64"), netns="pod")
    await rig.seen.wait_for(lambda: len(rig.seen.changed) > 0)
    await rig.quiesce()
    assert claim.attachment is not None
    assert claim.attachment.ns_addresses == ("198.51.100.5/26", "2001:db8::5/64")
    assert set(rig.seen.changed) == {claim.id}
