"""Every test here multicasts: it runs only inside the test run's private network namespace.

Where that namespace cannot be made the tests skip with the reason, unless
``$ANYWOOL_REQUIRE_LAN`` is set (CI sets it: it runs as root and must run them), which makes it
an error instead.
"""

from __future__ import annotations

import os

import pytest

from tests import netns


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = netns.lan_unavailable()
    if reason is None:
        return
    if os.environ.get("ANYWOOL_REQUIRE_LAN"):
        raise pytest.UsageError(f"$ANYWOOL_REQUIRE_LAN is set, but the LAN tests cannot run: "
                                f"{reason}")
    skip = pytest.mark.skip(reason=f"LAN tests need a private network namespace: {reason}")
    for item in items:
        if item.path.is_relative_to(config.rootpath / "tests" / "lan"):
            item.add_marker(skip)
