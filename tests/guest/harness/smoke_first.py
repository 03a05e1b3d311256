"""pytest plugin (run-guest-tests.sh loads it with -p): the guest smoke test runs first.

It checks the pristine guest; run after other tests it would report their leftovers as a
broken guest. A stable sort, applied last, so every other ordering is kept.
"""

from __future__ import annotations

import pytest

SMOKE = "test_guest_environment.py"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name != SMOKE)
