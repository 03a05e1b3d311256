"""The RDMA limit options (cgroup, hca_handles, hca_objects): checked before anything is
touched; where the cgroup is in the cgroup2 mount is the kernel adapter's check
(tests/unit/test_cgroup_adapter.py)."""

from __future__ import annotations

from typing import Any

import pytest

from rdmad.errors import InvalidArgs
from rdmad.model import RdmaLimit
from rdmad.options import RDMA_LIMIT_MAX, parse_claim_options


@pytest.mark.parametrize(
    ("options", "limit"),
    [
        ({"hca_handles": 1}, RdmaLimit(1, None)),
        ({"hca_objects": 2000}, RdmaLimit(None, 2000)),
        ({"hca_handles": 2, "hca_objects": 0}, RdmaLimit(2, 0)),
        ({"hca_handles": RDMA_LIMIT_MAX}, RdmaLimit(RDMA_LIMIT_MAX, None)),
        ({}, None),  # a cgroup alone: its usage is read, nothing is written
    ],
)
def test_a_limit_is_the_devices_line_in_the_cgroup(options: dict[str, Any], limit: Any) -> None:
    parsed = parse_claim_options(cgroup="kubepods.slice/pod1", **options)
    assert (parsed.cgroup, parsed.limit) == ("kubepods.slice/pod1", limit)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"hca_handles": 1}, "need option 'cgroup'"),
        ({"hca_objects": 1}, "need option 'cgroup'"),
        ({"cgroup": "a", "hca_handles": RDMA_LIMIT_MAX + 1}, r"hca_handles 2147483647 is out"),
        ({"cgroup": "a", "hca_objects": 2**32 - 1}, r"hca_objects 4294967295 is out of range"),
        ({"cgroup": "a\x00b", "hca_handles": 1}, "invalid cgroup"),
        ({"cgroup": "a" * 4096}, "at most 4095 bytes"),
    ],
)
def test_a_bad_limit_is_invalid_args(options: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidArgs, match=says):
        parse_claim_options(**options)
