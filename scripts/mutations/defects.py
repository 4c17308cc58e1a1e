"""Issue 21's defects undone one at a time: each fix's regression test must fail."""

from mutate import Mutation

MUTATIONS: list[Mutation] = [
    # Not listed: the shield around the worker's spawn (_local_worker.py). Without it, asyncio
    # kills the half-set-up process but does not wait for it; its child watcher reaps it
    # within a few milliseconds, so test_pool_cancelled.py catches the leak under load only.
    Mutation(
        name="namespace-key-cache-keeps-1024",
        path="src/anywool/discovery/local/_keys.py",
        old="@functools.lru_cache(maxsize=32)",
        new="@functools.lru_cache(maxsize=1024)",
        tests=("tests/integration/test_memory.py",),
        why="issue 21: a pool cycle keeps no memory",
    ),
    Mutation(
        name="subscription-probes-only-when-idle",
        path="src/anywool/discovery/_hub.py",
        old="probe = not ready or now >= probe_due",
        new="probe = not ready",
        tests=("tests/unit/test_local_discovery.py::test_a_registry_replaced_while_a_publisher_keeps_publishing_still_ends_subscriptions",),
        why="README: another file renamed over the registry ends every live iteration",
    ),
]
