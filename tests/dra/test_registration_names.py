"""Where an instance of the plugin serves (rdmad/dra/registration.py): the driver's names
alone, or, given its pod's UID, the names k8s.io/dynamic-resource-allocation's kubeletplugin
gives a rolling update (RollingUpdate, RollingUpdateRegistrarSocketFile): the UID in full
where the path fits in a socket address, else a hash of it, else a hash of driver and UID."""

from __future__ import annotations

import base64
import hashlib

import pytest

from rdmad.dra.registration import UNIX_PATH_MAX, registrar_socket_file, sockets

REGISTRY = "/var/lib/kubelet/plugins_registry"
PLUGINS = "/var/lib/kubelet/plugins"
DRIVER = "rdma.rdmad.io"
UID = "ad4af911-5bcd-47c5-a554-f35cea869472"


def b64(data: bytes) -> str:
    """Go's base64.RawURLEncoding."""
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def test_without_a_pod_uid_the_sockets_have_the_drivers_names() -> None:
    paths = sockets(REGISTRY, PLUGINS, DRIVER, "")
    assert paths.registration == f"{REGISTRY}/rdma.rdmad.io-reg.sock"
    assert paths.endpoint == f"{PLUGINS}/rdma.rdmad.io/dra.sock"
    assert paths.lock == f"{PLUGINS}/rdma.rdmad.io/serialize.lock"


def test_with_a_pod_uid_the_sockets_are_the_instances_and_the_lock_the_drivers() -> None:
    paths = sockets(REGISTRY, PLUGINS, DRIVER, UID)
    assert paths.registration == f"{REGISTRY}/rdma.rdmad.io-{UID}-reg.sock"
    assert paths.endpoint == f"{PLUGINS}/rdma.rdmad.io/dra-{UID}.sock"
    assert paths.lock == sockets(REGISTRY, PLUGINS, DRIVER, "").lock


@pytest.mark.parametrize(
    ("driver", "expected"),
    [
        pytest.param(DRIVER, f"{DRIVER}-{UID}-reg.sock", id="the UID in full"),
        pytest.param(
            "gpu.dra-example-driver.sigs.k8s.io",
            "gpu.dra-example-driver.sigs.k8s.io-"
            + b64(hashlib.sha256(UID.encode()).digest()[:8])
            + "-reg.sock",
            id="a hash of the UID",
        ),
        pytest.param(
            "a" * 100,
            "dra-"
            + b64(hashlib.sha256(("a" * 100 + "\0" + UID).encode()).digest()[:16])
            + "-reg.sock",
            id="a hash of driver and UID",
        ),
    ],
)
def test_the_registration_socket_is_the_first_name_whose_path_fits(
    driver: str, expected: str
) -> None:
    name = registrar_socket_file(REGISTRY, driver, UID)
    assert name == expected
    assert len(f"{REGISTRY}/{name}") <= UNIX_PATH_MAX


def test_two_pods_of_one_driver_get_two_registration_sockets() -> None:
    other = "11111111-2222-3333-4444-555555555555"
    assert registrar_socket_file(REGISTRY, DRIVER, UID) != registrar_socket_file(
        REGISTRY, DRIVER, other
    )
