"""rdmad-dra's DaemonSet (deploy/kubernetes/daemonset.yaml) as the tests read it: the
manifests, and the plugin container's host paths and downward-API environment, so that an
end-to-end run gives the plugin what the DaemonSet gives it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from testbed.daemon import ROOT

MANIFESTS = ROOT / "deploy" / "kubernetes"


@dataclass(frozen=True)
class Mount:
    """A hostPath volume as the container sees it."""

    host: str
    container: str
    read_only: bool


def documents(name: str) -> list[dict[str, Any]]:
    """The objects of manifest `name` (a file of MANIFESTS), in order."""
    with (MANIFESTS / name).open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def pod_spec() -> dict[str, Any]:
    (daemonset,) = documents("daemonset.yaml")
    spec: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return spec


def container() -> dict[str, Any]:
    (plugin,) = pod_spec()["containers"]
    return dict(plugin)


def mounts() -> list[Mount]:
    """The plugin container's host paths, in the manifest's order."""
    host = {v["name"]: v["hostPath"]["path"] for v in pod_spec()["volumes"]}
    return [
        Mount(host[m["name"]], m["mountPath"], bool(m.get("readOnly", False)))
        for m in container()["volumeMounts"]
    ]


def downward_env() -> dict[str, str]:
    """The environment the downward API gives the plugin: name -> the pod's field."""
    return {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in container()["env"]
        if "fieldRef" in e.get("valueFrom", {})
    }
