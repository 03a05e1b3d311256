"""What the prepare contract tests share: the API server serving a claim the scheduler
allocated, and the kubelet preparing claims through the plugin's v1 service."""

from __future__ import annotations

from typing import Any

from tests.dra import kubelet
from tests.dra.apiserver import ApiServer
from tests.dra.claims import claim
from tests.dra.plugin_process import Plugin

SERVICE = "v1.DRAPlugin"


def serve(api: ApiServer, ref: kubelet.Claim, devices: list[str], **kw: Any) -> None:
    api.put_claim(claim(ref.uid, devices, name=ref.name, namespace=ref.namespace, **kw))


async def prepare(plugin: Plugin, *refs: kubelet.Claim) -> dict[str, kubelet.Prepared]:
    return await kubelet.prepare_devices(str(plugin.endpoint), SERVICE, list(refs))
