"""Contract test: the plugin's .proto files (rdmad/dra/rpc/proto/) declare the kubelet's
packages, services, messages, field names, numbers and types, as the kubelet's API
definitions have them (k8s.io/kubelet pkg/apis/pluginregistration/v1, dra/v1, dra/v1beta1,
dra-health/v1 and v1alpha1).
The wire tests exercise the messages a kubelet sends today; this covers every field, such as
Device's, that no answer of the plugin carries yet."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor

from rdmad.dra.rpc import api

S, B, M = FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BOOL, FieldDescriptor.TYPE_MESSAGE
E, I64 = FieldDescriptor.TYPE_ENUM, FieldDescriptor.TYPE_INT64

# message -> field name -> (number, type, repeated)
REGISTRATION = {
    "PluginInfo": {
        "type": (1, S, False),
        "name": (2, S, False),
        "endpoint": (3, S, False),
        "supported_versions": (4, S, True),
    },
    "RegistrationStatus": {"plugin_registered": (1, B, False), "error": (2, S, False)},
    "RegistrationStatusResponse": {},
    "InfoRequest": {},
}
DRA = {
    "NodePrepareResourcesRequest": {"claims": (1, M, True)},
    "NodePrepareResourcesResponse": {"claims": (1, M, True)},  # a map: repeated entries
    "NodePrepareResourceResponse": {"devices": (1, M, True), "error": (2, S, False)},
    "Device": {
        "request_names": (1, S, True),
        "pool_name": (2, S, False),
        "device_name": (3, S, False),
        "cdi_device_ids": (4, S, True),
        "share_id": (5, S, False),  # v1 only
    },
    "NodeUnprepareResourcesRequest": {"claims": (1, M, True)},
    "NodeUnprepareResourcesResponse": {"claims": (1, M, True)},
    "NodeUnprepareResourceResponse": {"error": (1, S, False)},
    "Claim": {"namespace": (1, S, False), "uid": (2, S, False), "name": (3, S, False)},
}
DRA_V1BETA1 = {**DRA, "Device": {k: v for k, v in DRA["Device"].items() if k != "share_id"}}
HEALTH = {
    "NodeWatchResourcesRequest": {},
    "DeviceIdentifier": {"pool_name": (1, S, False), "device_name": (2, S, False)},
    "DeviceHealth": {
        "device": (1, M, False),
        "health": (2, E, False),
        "last_updated_time": (3, I64, False),
        "health_check_timeout_seconds": (4, I64, False),
        "message": (5, S, False),
    },
    "NodeWatchResourcesResponse": {"devices": (1, M, True)},
}
RPCS = {
    "pluginregistration": {
        "GetInfo": ("InfoRequest", "PluginInfo"),
        "NotifyRegistrationStatus": ("RegistrationStatus", "RegistrationStatusResponse"),
    },
    "dra": {
        "NodePrepareResources": ("NodePrepareResourcesRequest", "NodePrepareResourcesResponse"),
        "NodeUnprepareResources": (
            "NodeUnprepareResourcesRequest",
            "NodeUnprepareResourcesResponse",
        ),
    },
    "health": {"NodeWatchResources": ("NodeWatchResourcesRequest", "NodeWatchResourcesResponse")},
}
CASES = {
    "pluginregistration": (api.registration, "pluginregistration", REGISTRATION),
    "dra v1": (api.dra_v1, "k8s.io.kubelet.pkg.apis.dra.v1", DRA),
    "dra v1beta1": (api.dra_v1beta1, "k8s.io.kubelet.pkg.apis.dra.v1beta1", DRA_V1BETA1),
    "health v1": (api.HEALTH_MESSAGES[api.HEALTH_V1], "v1", HEALTH),
    "health v1alpha1": (api.HEALTH_MESSAGES[api.HEALTH_V1ALPHA1], "v1alpha1", HEALTH),
}


def fields_of(descriptor: Any) -> dict[str, tuple[int, int, bool]]:
    return {f.name: (f.number, f.type, f.is_repeated) for f in descriptor.fields}


@pytest.mark.parametrize("case", CASES)
def test_package_messages_and_fields_are_the_kubelets(case: str) -> None:
    module, package, messages = CASES[case]
    file = module.DESCRIPTOR
    assert file.package == package
    assert {name: fields_of(m) for name, m in file.message_types_by_name.items()} == messages


@pytest.mark.parametrize("case", CASES)
def test_services_and_methods_are_the_kubelets(case: str) -> None:
    module: ModuleType = CASES[case][0]
    (service,) = module.DESCRIPTOR.services_by_name.values()
    expected = RPCS[case.split()[0]]
    assert {m.name: (m.input_type.name, m.output_type.name) for m in service.methods} == expected
    full = service.full_name
    if case == "pluginregistration":
        assert full == api.REGISTRATION_SERVICE
    elif case.startswith("health"):
        assert full in api.HEALTH_VERSIONS
        (method,) = service.methods
        assert (method.client_streaming, method.server_streaming) == (False, True)
    else:
        assert full in api.DRA_SERVICES.values()


@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
def test_health_status_values_are_the_kubelets(version: str) -> None:
    module = api.HEALTH_MESSAGES[f"{version}.DRAResourceHealth"]
    values = module.DESCRIPTOR.enum_types_by_name["HealthStatus"].values_by_name
    assert {name: v.number for name, v in values.items()} == {
        "UNKNOWN": 0,
        "HEALTHY": 1,
        "UNHEALTHY": 2,
    }


def test_response_maps_are_keyed_by_claim_uid_strings() -> None:
    for module in (api.dra_v1, api.dra_v1beta1):
        for name in ("NodePrepareResourcesResponse", "NodeUnprepareResourcesResponse"):
            entry = module.DESCRIPTOR.message_types_by_name[name].fields_by_name["claims"]
            assert entry.message_type.GetOptions().map_entry
            key, value = entry.message_type.fields
            assert (key.name, key.number, key.type) == ("key", 1, S)
            assert (value.name, value.number) == ("value", 2)
