"""The loopback API server itself (testbed/dra/apiserver.py), where its behaviour is not the
plugin's: what it does with a request that never arrives whole."""

from __future__ import annotations

import socket
from urllib.parse import urlparse

from testbed.dra.apiserver import SLICES, ApiServer


def test_a_slice_write_cut_short_before_its_body_is_dropped_unanswered(api: ApiServer) -> None:
    """urllib3 sends a request's body after its headers: a plugin stopped between the two
    leaves a request that the API server drops, neither applied nor refused."""
    url = urlparse(api.url)
    assert url.hostname is not None and url.port is not None
    with socket.create_connection((url.hostname, url.port)) as conn:
        conn.sendall(
            f"POST {SLICES} HTTP/1.1\r\nHost: {url.netloc}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n".encode()
        )
        conn.shutdown(socket.SHUT_WR)
        assert conn.recv(1) == b""
    assert (api.writes, api.invalid, api.slices) == (0, [], {})
