"""What the prepare contract tests share: the API server serving a claim the scheduler
allocated, the kubelet preparing claims through the plugin's v1 service, and the holds
rdmad has made."""

from __future__ import annotations

from typing import Any

from testbed.dra import kubelet
from testbed.dra.apiserver import ApiServer
from testbed.dra.claims import claim
from testbed.dra.plugin_process import Plugin
from tests.support.sim_rig import Rig

SERVICE = "v1.DRAPlugin"
CLAIM_IFACE = "io.rdmad1.Claim"


def serve(api: ApiServer, ref: kubelet.Claim, devices: list[str], **kw: Any) -> None:
    api.put_claim(claim(ref.uid, devices, name=ref.name, namespace=ref.namespace, **kw))


async def prepare(plugin: Plugin, *refs: kubelet.Claim) -> dict[str, kubelet.Prepared]:
    return await kubelet.prepare_devices(str(plugin.endpoint), SERVICE, list(refs))


async def holds(rig: Rig) -> list[tuple[str, str, str]]:
    """rdmad's claims: (device, owner, State)."""
    rows = await rig.client.manager("ListClaims")
    return [(r[1], r[4], await rig.client.prop(r[5], CLAIM_IFACE, "State")) for r in rows]
