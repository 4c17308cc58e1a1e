"""Checked by pyright in tests/unit/test_typing.py, never imported by pytest."""

from typing import assert_type

from anywool import DiscoverySubscriberLike, LocalDiscovery

subscriber = LocalDiscovery.Subscriber("jobs", poll_interval=0.5)
assert_type(subscriber, DiscoverySubscriberLike)
LocalDiscovery.Subscriber("jobs", capacity=3)  # error: unknown parameter
