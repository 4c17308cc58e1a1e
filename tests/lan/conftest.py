"""Every test here multicasts: it runs only inside the test run's private network namespace."""

from __future__ import annotations

import pytest

from tests import netns


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = netns.lan_unavailable()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"LAN tests need a private network namespace: {reason}")
    for item in items:
        if item.path.is_relative_to(config.rootpath / "tests" / "lan"):
            item.add_marker(skip)
