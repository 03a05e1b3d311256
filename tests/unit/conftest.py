"""Fixtures for the core's in-memory tests (tests/support/core_rig.py)."""

from tests.support.core_rig import rigs

__all__ = ["rigs"]
