"""rdmad-dra's command line: the conventional flags of DRA kubelet plugins."""

from __future__ import annotations

import pytest

from rdmad.dra.plugin import parse_args


def test_defaults_are_the_kubelets_directories_and_the_driver_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NODE_NAME", "node-a")
    monkeypatch.delenv("DBUS_SYSTEM_BUS_ADDRESS", raising=False)
    args = parse_args([])
    assert args.kubelet_registrar_directory_path == "/var/lib/kubelet/plugins_registry"
    assert args.kubelet_plugins_directory_path == "/var/lib/kubelet/plugins"
    assert args.driver_name == "rdma.rdmad.io"
    assert args.node_name == "node-a"
    assert args.kubeconfig is None  # in-cluster
    assert args.bus_address == "unix:path=/var/run/dbus/system_bus_socket"
    assert args.port_down_taint == "NoSchedule"


def test_node_name_flag_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "node-a")
    assert parse_args(["--node-name", "node-b"]).node_name == "node-b"


def test_no_node_name_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    with pytest.raises(SystemExit) as exit:
        parse_args([])
    assert exit.value.code == 2
    assert "--node-name or set NODE_NAME" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--bus-address", "not-an-address"], "is not a D-Bus address"),
        (["--pod-uid", "../../etc"], "is not a UUID"),
        (["--port-down-taint", "PreferNoSchedule"], "invalid choice: 'PreferNoSchedule'"),
    ],
    ids=["bus-address", "pod-uid", "taint-effect"],
)
def test_a_flag_value_it_cannot_take_is_a_usage_error(
    argv: list[str],
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("NODE_NAME", "node-a")
    with pytest.raises(SystemExit) as exit:
        parse_args(argv)
    assert exit.value.code == 2
    assert said in capsys.readouterr().err


def test_the_pod_uid_comes_from_the_downward_apis_pod_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "node-a")
    monkeypatch.setenv("POD_UID", "ad4af911-5bcd-47c5-a554-f35cea869472")
    assert parse_args([]).pod_uid == "ad4af911-5bcd-47c5-a554-f35cea869472"
