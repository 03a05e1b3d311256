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
            },
            # the scheduler's, for devices of one node's pool (rdmad-dra's pool is its node)
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [pool]}]}
                ]
            },
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


# KEP-5004: a DeviceClass that backs the Mellanox shared device plugin's extended resource,
# so that pods written for it (`resources.limits: rdma/hca_shared_devices_a: 1`) get a
# share slot unchanged. deploy/kubernetes ships it.
EXTENDED_RESOURCE = "rdma/hca_shared_devices_a"
EXTENDED_CLASS: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "hca-shared-devices-a.rdma.rdmad.io"},
    "spec": {
        "extendedResourceName": EXTENDED_RESOURCE,
        "selectors": [
            {
                "cel": {
                    "expression": f'device.driver == "{DRIVER}" && '
                    f'device.attributes["{DRIVER}"].shared'
                }
            }
        ],
        "config": [
            {"opaque": {"driver": DRIVER, "parameters": {"kind": "RdmaConfig", "shared": True}}}
        ],
    },
}


def extended_resource_claim(
    uid: str, pod: str, devices: list[str], *, namespace: str = "default", pod_uid: str = POD_UID
) -> dict[str, Any]:
    """The claim the scheduler makes, allocates and reserves for pod `pod`, whose first
    container asks for EXTENDED_RESOURCE (as many as `devices`), as kube-scheduler's
    dynamicresources plugin writes it: named after the pod, owned by it, annotated as the
    extended resource claim, one request per container and resource
    (`container-<i>-request-<j>`), and the class's config in the allocation."""
    request = "container-0-request-0"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"{pod}-extended-resources-x7k2p",
            "generateName": f"{pod}-extended-resources-",
            "namespace": namespace,
            "uid": uid,
            "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
            "finalizers": ["resource.kubernetes.io/delete-protection"],
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod,
                    "uid": pod_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": request,
                        "exactly": {
                            "deviceClassName": EXTENDED_CLASS["metadata"]["name"],
                            "allocationMode": "ExactCount",
                            "count": len(devices),
                        },
                    }
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": request, "driver": DRIVER, "pool": NODE, "device": d}
                        for d in devices
                    ],
                    "config": [
                        {"source": "FromClass", "requests": [request], **config}
                        for config in EXTENDED_CLASS["spec"]["config"]
                    ],
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [NODE]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": pod, "uid": pod_uid}],
        },
    }
