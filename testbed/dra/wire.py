"""Protocol buffers' wire format, written out by hand for the kubelet's side of the
contract tests: the messages are encoded with the field numbers of the kubelet's own API
definitions (k8s.io/kubelet pkg/apis/pluginregistration/v1, dra/v1, dra/v1beta1,
dra-health/v1 and v1alpha1), never
with the plugin's .proto files, so a wrong number or type there fails these tests.

A message is a dict: field number -> list of values, each an int (varint), bytes
(length-delimited: strings and sub-messages), in wire order."""

from __future__ import annotations

from collections import defaultdict

VARINT, LENGTH = 0, 2
Fields = dict[int, list[int | bytes]]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def encode(*fields: tuple[int, int | str | bytes | bool]) -> bytes:
    """(number, value) pairs: an int or bool is a varint, a str or bytes length-delimited."""
    out = bytearray()
    for number, value in fields:
        if isinstance(value, bool | int):
            out += _varint(number << 3 | VARINT) + _varint(int(value))
        else:
            data = value.encode() if isinstance(value, str) else value
            out += _varint(number << 3 | LENGTH) + _varint(len(data)) + data
    return bytes(out)


def decode(data: bytes) -> Fields:
    fields: Fields = defaultdict(list)
    i = 0

    def varint() -> int:
        nonlocal i
        shift = n = 0
        while True:
            byte = data[i]
            i += 1
            n |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return n

    while i < len(data):
        tag = varint()
        number, kind = tag >> 3, tag & 7
        if kind == VARINT:
            fields[number].append(varint())
        elif kind == LENGTH:
            size = varint()
            fields[number].append(data[i : i + size])
            i += size
        else:
            raise ValueError(f"field {number}: wire type {kind} is in none of these messages")
    return dict(fields)


def string(fields: Fields, number: int) -> str:
    """A singular string field ("" when absent, as proto3 has it)."""
    values = fields.get(number, [b""])
    assert len(values) == 1 and isinstance(values[-1], bytes), (number, values)
    return values[-1].decode()


def integer(fields: Fields, number: int) -> int:
    """A singular varint field (0 when absent, as proto3 has it)."""
    values = fields.get(number, [0])
    assert len(values) == 1 and isinstance(values[-1], int), (number, values)
    return values[-1]


def strings(fields: Fields, number: int) -> list[str]:
    out = []
    for v in fields.get(number, []):
        assert isinstance(v, bytes), (number, v)
        out.append(v.decode())
    return out


def messages(fields: Fields, number: int) -> list[Fields]:
    out = []
    for v in fields.get(number, []):
        assert isinstance(v, bytes), (number, v)
        out.append(decode(v))
    return out
