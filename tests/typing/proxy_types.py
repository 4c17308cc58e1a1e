"""Checked by pyright in tests/unit/test_typing.py, never imported by pytest."""

from anywool import LocalDiscovery, WorkerProxy

subscriber = LocalDiscovery.Subscriber("jobs")
WorkerProxy(subscriber, lazy=False)
WorkerProxy(discovery=subscriber, lazy=False)
WorkerProxy("jobs", "gpu", quorum=2)
WorkerProxy()  # error: no discovery
WorkerProxy(subscriber, discovery=subscriber)  # error: both
WorkerProxy(discovery="jobs")  # error: a pool URI is positional
