"""The nldev codec on hand-built bytes: requests as iproute2's rdma tool sends them, replies
as the kernel builds them (nlmsghdr + 4-byte aligned nlattrs)."""

from __future__ import annotations

import errno
import struct

import pytest

from rdmad.errors import KernelError, Unavailable
from rdmad.kernel import netlink
from rdmad.kernel import rdma_nl as nl


def hdr(length: int, typ: int, flags: int, seq: int, pid: int = 0) -> bytes:
    return struct.pack("=IHHII", length, typ, flags, seq, pid)


def nla(kind: int, payload: bytes) -> bytes:
    pad = (-len(payload)) % 4
    return struct.pack("=HH", 4 + len(payload), kind) + payload + b"\0" * pad


def msg(typ: int, flags: int, seq: int, body: bytes, pid: int = 1234) -> bytes:
    return hdr(16 + len(body), typ, flags, seq, pid) + body


def u32(v: int) -> bytes:
    return struct.pack("=I", v)


def u64(v: int) -> bytes:
    return struct.pack("=Q", v)


def error(seq: int, code: int, flags: int = 0, tlvs: bytes = b"") -> bytes:
    echoed = hdr(16, nl.msg_type(nl.Cmd.SET), 5, seq)
    return msg(netlink.NLMSG_ERROR, flags, seq, struct.pack("=i", code) + echoed + tlvs)


# ---------------------------------------------------------------- requests


def test_message_type_is_nldev_client_shifted_plus_op() -> None:
    assert nl.msg_type(nl.Cmd.GET) == 5121
    assert nl.msg_type(nl.Cmd.MONITOR) == 5120 + 28
    assert nl.cmd_of(5120 + 15) == nl.Cmd.GET_CHARDEV
    assert nl.cmd_of((2 << 10) + 1) is None  # the IWCM client


def test_get_dump_is_a_bare_header_with_dump_flags() -> None:
    assert nl.get_dev(seq=7) == hdr(16, 5121, 0x301, 7)


def test_get_one_device_carries_dev_index_and_asks_for_an_ack() -> None:
    assert nl.get_dev(seq=1, index=3) == hdr(24, 5121, 0x5, 1) + nla(1, u32(3))


def test_port_dump_carries_the_device_index() -> None:
    assert nl.get_ports(seq=2, index=4) == hdr(24, 5125, 0x301, 2) + nla(1, u32(4))


def test_sys_set_netns_mode_is_a_padded_u8() -> None:
    body = struct.pack("=HHB3x", 5, 66, 0)
    assert nl.set_netns_mode(seq=9, shared=False) == hdr(24, 5127, 0x5, 9) + body


def test_set_netns_carries_dev_index_and_net_ns_fd() -> None:
    body = nla(1, u32(2)) + nla(68, u32(11))
    assert nl.set_dev_netns(seq=3, index=2, netns_fd=11) == hdr(32, 5122, 0x5, 3) + body


def test_get_chardev_strings_are_nul_terminated_and_padded() -> None:
    body = struct.pack("=HH", 11, 69) + b"uverbs\0" + b"\0" + nla(1, u32(0))
    assert nl.get_chardev(seq=1, kind="uverbs", index=0) == hdr(16 + len(body), 5135, 5, 1) + body


def test_get_chardev_for_umad_names_the_port_and_rdma_cm_names_nothing() -> None:
    umad = nl.get_chardev(seq=1, kind="umad", index=0, port=1)
    assert umad.endswith(nla(1, u32(0)) + nla(3, u32(1)))
    assert nl.get_chardev(seq=1, kind="rdma_cm") == hdr(28, 5135, 5, 1) + nla(69, b"rdma_cm\0")


# ---------------------------------------------------------------- replies


def test_split_reads_every_message_of_a_datagram() -> None:
    a = msg(5121, netlink.NLM_F_MULTI, 5, nla(1, u32(0)) + nla(2, b"rxe0\0"))
    b = msg(5121, netlink.NLM_F_MULTI, 5, nla(1, u32(1)) + nla(2, b"mlx5_0\0"))
    names = [nl.attrs_of(m).string(nl.Attr.DEV_NAME) for m in netlink.split(a + b)]
    assert names == ["rxe0", "mlx5_0"]


def test_split_refuses_a_truncated_message() -> None:
    with pytest.raises(ValueError, match="truncated"):
        netlink.split(msg(5121, 0, 1, nla(1, u32(0)))[:-2])


def test_multipart_dump_completes_at_done() -> None:
    reply = netlink.Reply(seq=5)
    parts = netlink.split(
        msg(5121, 2, 5, nla(2, b"a\0")) + msg(5121, 2, 5, nla(2, b"b\0")) + msg(3, 2, 5, u32(0))
    )
    assert [reply.feed(m) for m in parts] == [False, False, True]
    assert [nl.attrs_of(m).string(2) for m in reply.messages] == ["a", "b"]


def test_done_with_a_negative_payload_is_an_error() -> None:
    with pytest.raises(netlink.NetlinkError) as e:
        netlink.Reply(seq=5).feed(netlink.split(msg(3, 2, 5, struct.pack("=i", -errno.EINVAL)))[0])
    assert e.value.errno == errno.EINVAL


def test_doit_completes_at_the_ack() -> None:
    reply = netlink.Reply(seq=1)
    data, ack = netlink.split(
        msg(5126, 0, 1, nla(66, b"\1")) + error(1, 0, flags=netlink.NLM_F_CAPPED)
    )
    assert not reply.feed(data)
    assert reply.feed(ack)
    assert reply.messages == [data]


def test_nlmsg_error_carries_the_errno() -> None:
    (err,) = netlink.split(error(4, -errno.EBUSY, flags=netlink.NLM_F_CAPPED))
    with pytest.raises(netlink.NetlinkError) as e:
        netlink.Reply(seq=4).feed(err)
    assert (e.value.errno, e.value.extack) == (errno.EBUSY, "")


def test_nlmsg_error_carries_the_extended_ack_message() -> None:
    flags = netlink.NLM_F_CAPPED | netlink.NLM_F_ACK_TLVS
    (err,) = netlink.split(error(4, -errno.EOPNOTSUPP, flags, nla(1, b"no netns change\0")))
    assert netlink.parse_error(err) == (errno.EOPNOTSUPP, "no netns change")


def test_a_kernel_refusal_is_named_with_the_kernels_own_words() -> None:
    refused = netlink.NetlinkError(errno.EINVAL, "MTU too big")
    mapped = netlink.kernel_error(refused, "setting the MTU")
    assert isinstance(mapped, KernelError)
    assert str(mapped) == "setting the MTU: EINVAL (Invalid argument): MTU too big"


def test_a_netlink_family_the_kernel_lacks_is_unavailable() -> None:
    no_family = OSError(errno.EPROTONOSUPPORT, "Protocol not supported")
    assert isinstance(netlink.kernel_error(no_family, "opening RDMA netlink"), Unavailable)


def test_a_kernel_reply_with_econnrefused_is_a_kernel_error_not_unavailable() -> None:
    refused = netlink.NetlinkError(errno.ECONNREFUSED)
    assert isinstance(netlink.kernel_error(refused, "reading netdev 3"), KernelError)


def test_attributes_skip_pad_and_strip_flag_bits() -> None:
    nested = struct.pack("=HH", 8, 0x8000 | 52) + u32(7)  # NLA_F_NESTED set
    attrs = netlink.Attrs.parse(nla(0, u32(0)) + nested + nla(72, u64(1)))
    assert 0 not in attrs
    assert attrs.nested(52).raw == {}  # a u32 payload holds no further attributes
    assert attrs.u64(72) == 1


def test_nested_attributes_decode() -> None:
    inner = nla(54, b"name\0") + nla(55, u32(3))
    attrs = netlink.Attrs.parse(nla(53, inner))
    assert attrs.nested(53).string(54) == "name"
    assert attrs.nested(53).u32(55) == 3


# ---------------------------------------------------------------- typed replies


def test_huge_encode_dev_decodes_to_major_and_minor() -> None:
    assert nl.decode_chardev((231 << 8) | 192) == (231, 192)  # uverbs0
    # minor 0x12345: low byte in bits 0-7, the rest from bit 20 up
    assert nl.decode_chardev((0x123 << 20) | (10 << 8) | 0x45) == (10, 0x12345)


def test_node_guid_prints_like_rdma_dev() -> None:
    assert nl.format_guid(0x002413FFFEC5518F) == "0024:13ff:fec5:518f"


def test_dev_info_from_a_get_reply() -> None:
    body = (
        nla(1, u32(0))
        + nla(2, b"rxe0\0")
        + nla(3, u32(1))
        + nla(6, u64(0x002413FFFEC5518F))
        + nla(67, b"roce\0")
    )
    info = nl.dev_info(netlink.split(msg(5121, 2, 1, body))[0])
    assert info == nl.DevInfo(0, "rxe0", 1, "0024:13ff:fec5:518f", "roce")


def test_port_info_names_states_like_rdma_link() -> None:
    body = (
        nla(1, u32(0))
        + nla(2, b"rxe0\0")
        + nla(3, u32(1))
        + nla(12, b"\4")
        + nla(13, b"\5")
        + nla(50, u32(3))
        + nla(51, b"veth0\0")
    )
    port = nl.port_info(netlink.split(msg(5125, 2, 1, body))[0])
    assert (port.state, port.phys_state, port.netdev, port.netdev_index) == (
        "ACTIVE",
        "LINK_UP",
        "veth0",
        3,
    )


def test_sys_info_reads_netns_mode_and_monitor_support() -> None:
    body = nla(66, b"\0") + nla(103, b"\1")
    assert nl.sys_info(netlink.split(msg(5126, 0, 1, body))[0]) == nl.SysInfo(False, True)


def test_chardev_info_from_a_get_chardev_reply() -> None:
    body = nla(72, u64((231 << 8) | 192)) + nla(71, u64(6)) + nla(70, b"uverbs0\0")
    body += nla(73, u64(nl.DRIVER_ID_RXE))
    info = nl.chardev_info(netlink.split(msg(5135, 0, 1, body))[0])
    assert info == nl.ChardevInfo("uverbs0", 231, 192, nl.DRIVER_ID_RXE)


def test_monitor_event_from_a_notification() -> None:
    body = nla(102, b"\0") + nla(1, u32(2)) + nla(2, b"rxe1\0")
    ev = nl.monitor_event(netlink.split(msg(5120 + 28, 0, 0, body, pid=0))[0])
    assert (ev.event, ev.dev_index, ev.dev_name) == (nl.EventType.REGISTER, 2, "rxe1")
