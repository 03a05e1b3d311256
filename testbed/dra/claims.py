"""ResourceClaims as the API server serves them once the scheduler allocated them and the
kubelet reserved them for a pod (resource.k8s.io/v1 JSON), for the prepare tests."""

from __future__ import annotations

from typing import Any

DRIVER = "rdma.rdmad.io"
NODE = "node-a"
POD_UID = "6f1c0a52-3b7d-4e0a-9c1f-2d5e8b7a4c30"


def claim(
    uid: str,
    devices: list[str],
    *,
    name: str = "pod-a-rdma",
    namespace: str = "default",
    pool: str = NODE,
    pods: tuple[str, ...] = (POD_UID,),
    parameters: dict[str, Any] | None = None,
    allocated: bool = True,
) -> dict[str, Any]:
    """A claim whose request `rdma` got `devices` (their names in the node's slices), with
    `parameters` as the claim's opaque config for this driver."""
    status: dict[str, Any] = {}
    if allocated:
        config = []
        if parameters is not None:
            config = [
                {
                    "source": "FromClaim",
                    "requests": ["rdma"],
                    "opaque": {"driver": DRIVER, "parameters": parameters},
                }
            ]
        status["allocation"] = {
            "devices": {
                "results": [
                    {"request": "rdma", "driver": DRIVER, "pool": pool, "device": d}
                    for d in devices
                ],
                "config": config,
            }
        }
        status["reservedFor"] = [
            {"resource": "pods", "name": f"pod-{p[:4]}", "uid": p} for p in pods
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "rdma",
                        "exactly": {"deviceClassName": "rdma.rdmad.io", "count": len(devices)},
                    }
                ]
            }
        },
        "status": status,
    }
