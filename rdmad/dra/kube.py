"""The API server, through the kubernetes client: the node's UID and its ResourceSlices, and
the ResourceClaims the kubelet asks the plugin to prepare. Blocking calls (urllib3), for
rdmad/dra/slices.py's worker thread and rdmad/dra/prepare.py's threads."""

from __future__ import annotations

import re
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from rdmad.dra.slices import ApiFailed

# Each call's (connect, read) bound: a slow API server fails the call, then backoff.
REQUEST_TIMEOUT = (10.0, 30.0)
# A claim's read, within the kubelet's own bound on a prepare call (its default: 45 s), so
# that a slow API server is the claim's error, not a dropped call.
CLAIM_READ_TIMEOUT = (5.0, 20.0)
_VERSION = re.compile(r"v?(\d+)\.(\d+)")
APPLY_PATCH = "application/apply-patch+yaml"  # JSON is YAML: the client sends JSON


def api_client(kubeconfig: str | None) -> client.ApiClient:
    """From `kubeconfig` (the node's kubelet credentials), else the pod's service account."""
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=configuration
        )
    else:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    # No retries within a call: its callers retry (the kubelet its prepare, the slice worker
    # after its backoff). urllib3's default 3 retries of a GET that timed out reading made a
    # claim's read take 4 x 20 s, past the kubelet's 45 s bound on the prepare.
    configuration.retries = False
    return client.ApiClient(configuration)


def _failed(call: str, e: Exception) -> ApiFailed:
    if isinstance(e, ApiException):
        return ApiFailed(f"{call}: {e.status} {e.reason}: {str(e.body or '').strip()[:200]}")
    if isinstance(e, urllib3.exceptions.TimeoutError):
        return ApiFailed(f"{call}: the API server did not answer in time: {e}")
    return ApiFailed(f"{call}: {e}")


# ValueError: a reply the client's models cannot parse (pydantic's ValidationError)
_ERRORS = (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError)


class KubeSliceApi:
    """rdmad/dra/slices.py's SliceApi on a kubernetes ApiClient."""

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self._core = client.CoreV1Api(api)
        self._resource = client.ResourceV1Api(api)

    def node_uid(self, node: str) -> str:
        try:
            reply = self._core.read_node(node, _request_timeout=REQUEST_TIMEOUT)
        except _ERRORS as e:
            raise _failed(f"get node {node}", e) from e
        if reply.metadata is None or not reply.metadata.uid:
            raise ApiFailed(f"get node {node}: no uid in the reply")
        return reply.metadata.uid

    def server_version(self) -> tuple[int, int]:
        """(major, minor) from the API server's /version: its gitVersion, as `minor` may
        carry a vendor's suffix (`36+`)."""
        try:
            reply = client.VersionApi(self._api).get_code(_request_timeout=REQUEST_TIMEOUT)
        except _ERRORS as e:
            raise _failed("get version", e) from e
        found = _VERSION.match(reply.git_version or "")
        if found is None:
            raise ApiFailed(f"get version: no version in gitVersion {reply.git_version!r}")
        return int(found[1]), int(found[2])

    def list_slices(self, driver: str, node: str) -> list[dict[str, Any]]:
        try:
            reply = self._resource.list_resource_slice(
                field_selector=f"spec.driver={driver},spec.nodeName={node}",
                _request_timeout=REQUEST_TIMEOUT,
            )
        except _ERRORS as e:
            raise _failed("list resourceslices", e) from e
        return [s.model_dump(by_alias=True, exclude_none=True, mode="json") for s in reply.items]

    def create_slice(self, body: dict[str, Any]) -> None:
        try:
            self._resource.create_resource_slice(
                client.V1ResourceSlice.model_validate(body), _request_timeout=REQUEST_TIMEOUT
            )
        except _ERRORS as e:
            raise _failed("create resourceslice", e) from e

    def replace_slice(self, name: str, body: dict[str, Any]) -> None:
        try:
            self._resource.replace_resource_slice(
                name, client.V1ResourceSlice.model_validate(body), _request_timeout=REQUEST_TIMEOUT
            )
        except _ERRORS as e:
            raise _failed(f"update resourceslice {name}", e) from e

    def delete_slice(self, name: str) -> None:
        try:
            self._resource.delete_resource_slice(name, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as e:
            if e.status == 404:  # gone already: what we wanted
                return
            raise _failed(f"delete resourceslice {name}", e) from e
        except _ERRORS as e:
            raise _failed(f"delete resourceslice {name}", e) from e


class KubeClaimApi:
    """rdmad/dra/prepare.py's ClaimApi and rdmad/dra/claim_status.py's StatusApi on a
    kubernetes ApiClient; `driver` is the status's field manager."""

    def __init__(self, api: client.ApiClient, driver: str) -> None:
        self._resource = client.ResourceV1Api(api)
        self._driver = driver

    def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            reply = self._resource.read_namespaced_resource_claim(
                name, namespace, _request_timeout=CLAIM_READ_TIMEOUT
            )
        except _ERRORS as e:
            raise _failed(f"get resourceclaim {namespace}/{name}", e) from e
        claim: dict[str, Any] = reply.model_dump(by_alias=True, exclude_none=True, mode="json")
        return claim

    def apply_status(self, namespace: str, name: str, devices: list[dict[str, Any]]) -> None:
        """Server-side apply of the status subresource, as field manager `driver`, forced:
        the driver's entries are `devices`, and those it sent before and not now go."""
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "status": {"devices": devices} if devices else {},
        }
        try:
            self._resource.patch_namespaced_resource_claim_status(
                name,
                namespace,
                body,
                field_manager=self._driver,
                force=True,
                _content_type=APPLY_PATCH,
                _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as e:
            if e.status == 404 and not devices:  # the claim is gone, and its status with it
                return
            raise _failed(f"apply resourceclaim {namespace}/{name} status", e) from e
        except _ERRORS as e:
            raise _failed(f"apply resourceclaim {namespace}/{name} status", e) from e
