"""rdmad-cni's input: the attachment as an owner label, CNI_ARGS, result shapes."""

from __future__ import annotations

import pytest

from rdmad.cni.config import attachment_owner, parse_env, parse_netconf, parse_owner
from rdmad.cni.spec import CniError, shape_result

ENV = {
    "CNI_COMMAND": "ADD",
    "CNI_CONTAINERID": "c1",
    "CNI_NETNS": "/run/netns/x",
    "CNI_IFNAME": "net1",
}


def test_owner_round_trips_the_attachment() -> None:
    assert parse_owner(attachment_owner("rdma0", "abc123", "eth0")) == ("rdma0", "abc123", "eth0")


@pytest.mark.parametrize("owner", ["", "ctr", "cni/a/b", "other/a/b/c", "cni/a/b/c/d"])
def test_owners_not_made_by_the_plugin_are_not_attachments(owner: str) -> None:
    assert parse_owner(owner) is None


def test_cni_args_are_key_value_pairs() -> None:
    env = parse_env(ENV | {"CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAME=web"})
    assert env.args == {"IgnoreUnknown": "1", "K8S_POD_NAME": "web"}


def test_cni_args_without_equals_is_error_4() -> None:
    with pytest.raises(CniError) as err:
        parse_env(ENV | {"CNI_ARGS": "nonsense"})
    assert err.value.code == 4


def test_del_needs_no_netns() -> None:
    assert parse_env(ENV | {"CNI_COMMAND": "DEL", "CNI_NETNS": ""}).netns == ""


def test_top_level_device_id_wins_over_runtime_config() -> None:
    conf = parse_netconf(
        b'{"cniVersion": "1.0.0", "name": "n", "deviceID": "0000:3b:00.2",'
        b' "runtimeConfig": {"deviceID": "0000:3b:00.3"}}',
        "ADD",
    )
    assert conf.device_id == "0000:3b:00.2"


def test_a_key_of_the_wrong_type_is_error_7() -> None:
    with pytest.raises(CniError) as err:
        parse_netconf(
            b'{"cniVersion": "1.0.0", "name": "n", "device": "d", "shared": "yes"}', "ADD"
        )
    assert (err.value.code, err.value.msg) == (7, "shared must be a JSON boolean")


def test_040_result_carries_ip_versions() -> None:
    result = {"ips": [{"address": "10.0.0.2/24"}, {"address": "fd00::2/64"}]}
    assert [ip["version"] for ip in shape_result(result, "0.4.0")["ips"]] == ["4", "6"]
