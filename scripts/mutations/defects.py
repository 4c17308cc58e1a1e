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
]
