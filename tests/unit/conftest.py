"""Fixtures for the unit tests: the core's in-memory rigs (tests/support/core_rig.py) and a
sysfs tree of our own."""

from pathlib import Path

import pytest

from rdmad.kernel import rdma_sysfs
from tests.support.core_rig import rig, rigs

__all__ = ["rig", "rigs", "sysfs"]


@pytest.fixture
def sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty /sys that rdmad's sysfs readers read instead of the host's."""
    monkeypatch.setattr(rdma_sysfs, "INFINIBAND_CLASS", str(tmp_path / "class/infiniband"))
    return tmp_path
