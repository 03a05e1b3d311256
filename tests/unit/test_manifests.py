"""deploy/kubernetes/: each object is one the API server would take (it deserializes into
the kubernetes client's model, and back to the same document: no field misspelled or
misplaced), the DaemonSet gives the plugin every path it uses and rolls out as a rolling
upgrade, the RBAC grants what the plugin does, and the DeviceClasses select by attributes
the driver publishes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from rdmad.bus.address import SYSTEM_BUS
from rdmad.dra.offer import RdmadState, offered
from rdmad.dra.plugin import DEFAULT_DRIVER, parse_args
from rdmad.dra.podcgroup import CGROUP2_MOUNT
from testbed.daemon import ROOT
from testbed.dra import daemonset
from testbed.dra.claim_status import ASSOCIATED_NODE_PATCH, STATUS_PATCH
from testbed.dra.daemonset import MANIFESTS, Mount

MODELS = {
    "ServiceAccount": client.V1ServiceAccount,
    "ClusterRole": client.V1ClusterRole,
    "ClusterRoleBinding": client.V1ClusterRoleBinding,
    "DeviceClass": client.V1DeviceClass,
    "DaemonSet": client.V1DaemonSet,
}
DOCUMENTS = [
    (path.name, doc)
    for path in sorted(MANIFESTS.glob("*.yaml"))
    if path.name != "kustomization.yaml"
    for doc in daemonset.documents(path.name)
]
# A CEL reference to a device attribute: device.attributes["<domain>"].<name>
ATTRIBUTE = re.compile(r'device\.attributes\["([^"]+)"\]\.([A-Za-z_][A-Za-z0-9_]*)')
DRIVER_IS = re.compile(r'device\.driver == "([^"]+)"')


def kind(name: str) -> list[dict[str, Any]]:
    return [doc for _, doc in DOCUMENTS if doc["kind"] == name]


def device_classes() -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in kind("DeviceClass")}


@pytest.mark.parametrize(
    "doc",
    [pytest.param(d, id=f"{f}:{d['kind']}/{d['metadata']['name']}") for f, d in DOCUMENTS],
)
def test_each_object_deserializes_into_its_model_and_back_unchanged(doc: dict[str, Any]) -> None:
    api = client.ApiClient()
    model = api.deserialize(json.dumps(doc), MODELS[doc["kind"]].__name__, "application/json")
    assert isinstance(model, MODELS[doc["kind"]])
    assert api.sanitize_for_serialization(model) == doc


def test_the_kustomization_names_every_manifest_once() -> None:
    (kustomization,) = daemonset.documents("kustomization.yaml")
    files = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)


def test_the_daemonset_upgrades_with_the_new_pod_beside_the_old_one() -> None:
    (ds,) = kind("DaemonSet")
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }


def test_the_daemonset_gives_the_plugin_its_node_and_pod_from_the_downward_api() -> None:
    assert daemonset.downward_env() == {"NODE_NAME": "spec.nodeName", "POD_UID": "metadata.uid"}


def test_the_daemonset_runs_the_image_make_image_builds() -> None:
    version = re.match(r"rdmad \(([^)]+)\)", (ROOT / "debian/changelog").read_text())
    assert version is not None
    assert daemonset.container()["image"] == f"localhost/rdmad-dra:{version[1]}"


def test_the_daemonset_mounts_every_host_path_the_plugin_uses_and_no_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pod = {"spec.nodeName": "node-a", "metadata.uid": "ad4af911-5bcd-47c5-a554-f35cea869472"}
    for name, field in daemonset.downward_env().items():
        monkeypatch.setenv(name, pod[field])
    args = parse_args(daemonset.container().get("args", []))
    bus_socket = SYSTEM_BUS.removeprefix("unix:path=")
    used = {
        args.kubelet_registrar_directory_path: Mount(
            args.kubelet_registrar_directory_path, args.kubelet_registrar_directory_path, False
        ),
        f"{args.kubelet_plugins_directory_path}/{args.driver_name}": Mount(
            f"/var/lib/kubelet/plugins/{DEFAULT_DRIVER}",
            f"{args.kubelet_plugins_directory_path}/{args.driver_name}",
            False,
        ),
        str(Path(bus_socket).parent): Mount("/run/dbus", str(Path(bus_socket).parent), False),
        str(args.cgroup_root): Mount(str(CGROUP2_MOUNT), str(args.cgroup_root), True),
    }
    assert args.bus_address == SYSTEM_BUS
    assert sorted(daemonset.mounts(), key=lambda m: m.container) == sorted(
        used.values(), key=lambda m: m.container
    )


def test_the_cluster_role_grants_what_the_plugin_does_in_the_api() -> None:
    (role,) = kind("ClusterRole")
    grants = {
        (group, resource, verb, tuple(rule.get("resourceNames", ())))
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    wanted = {
        ("", "nodes", "get", ()),
        *(
            ("resource.k8s.io", "resourceslices", verb, ())
            for verb in ("get", "list", "watch", "create", "update", "delete")
        ),
        *(("resource.k8s.io", "resourceclaims", verb, ()) for verb in ("get", "list", "watch")),
        *(
            ("resource.k8s.io", "resourceclaims/status", verb, ())
            for verb in ("get", "update", "patch")
        ),
        *(
            ("resource.k8s.io", "resourceclaims/driver", verb, (DEFAULT_DRIVER,))
            for verb in ("associated-node:update", "associated-node:patch")
        ),
    }
    assert grants == wanted


def test_the_cluster_role_grants_what_the_api_server_asks_of_the_device_status_write() -> None:
    """The permissions the API server double checks on the plugin's status apply, as the
    real one does since 1.36 (testbed/dra/claim_status.py), for the driver's name."""
    (role,) = kind("ClusterRole")
    granted = {
        (resource, verb)
        for rule in role["rules"]
        if "resource.k8s.io" in rule["apiGroups"]
        and DEFAULT_DRIVER in rule.get("resourceNames", [DEFAULT_DRIVER])
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert {STATUS_PATCH, ASSOCIATED_NODE_PATCH} <= granted


def test_the_binding_gives_the_role_to_the_daemonsets_service_account() -> None:
    (binding,) = kind("ClusterRoleBinding")
    (account,) = kind("ServiceAccount")
    (ds,) = kind("DaemonSet")
    assert binding["roleRef"]["name"] == kind("ClusterRole")[0]["metadata"]["name"]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    assert ds["metadata"]["namespace"] == account["metadata"]["namespace"]


def published() -> list[dict[str, Any]]:
    """What the driver publishes for one device in shared netns mode: the whole device and
    its share slots."""
    device = {
        "Name": "mlx5_0",
        "NetDevice": "ens1f0",
        "Driver": "mlx5_core",
        "LinkLayer": "Ethernet",
        "PciAddress": "",
        "NumaNode": 0,
        "NodeGuid": "0002:c903:0031:7a40",
        "State": "available",
    }
    return offered(RdmadState([device], [], "shared", 2))


@pytest.mark.parametrize("name", sorted(device_classes()))
def test_each_device_class_selects_by_the_driver_and_attributes_it_publishes(name: str) -> None:
    devices = published()
    for selector in device_classes()[name]["spec"]["selectors"]:
        expression = selector["cel"]["expression"]
        assert DRIVER_IS.findall(expression) == [DEFAULT_DRIVER]
        referenced = ATTRIBUTE.findall(expression)
        assert referenced
        for domain, attribute in referenced:
            key = attribute if domain == DEFAULT_DRIVER else f"{domain}/{attribute}"
            assert all(key in d["attributes"] for d in devices), (name, key)


def test_the_extended_resource_class_selects_what_the_shared_class_does() -> None:
    classes = device_classes()
    extended = classes["hca-shared-devices-a.rdma.rdmad.io"]["spec"]
    assert extended["extendedResourceName"] == "rdma/hca_shared_devices_a"
    assert extended["selectors"] == classes["shared.rdma.rdmad.io"]["spec"]["selectors"]
    assert "extendedResourceName" not in classes["rdma.rdmad.io"]["spec"]
