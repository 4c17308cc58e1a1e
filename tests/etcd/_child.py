"""A process that owns or publishes into an etcd namespace until it is killed (for the tests'
real SIGKILLs).

    python -m tests.etcd._child owner|publisher URL PREFIX NAMESPACE LEASE_TTL [WORKERS]

Prints ``ready <generation>`` once it holds its claim (owner) or announced its workers
(publisher, one ``worker <uid>`` line each before), then waits for a signal.
"""

from __future__ import annotations

import sys
import uuid

import anyio

from anywool import EtcdDiscovery, WorkerMetadata


def say(line: str) -> None:
    print(line, flush=True)


async def main(role: str, url: str, prefix: str, namespace: str, ttl: int, workers: int) -> None:
    if role == "owner":
        async with EtcdDiscovery(namespace, endpoints=url, prefix=prefix, lease_ttl=ttl) as owner:
            say(f"ready {owner.generation}")
            await anyio.sleep_forever()
    async with EtcdDiscovery.Publisher(namespace, endpoints=url, prefix=prefix,
                                       lease_ttl=ttl) as publisher:
        for i in range(workers):
            uid = uuid.uuid4()
            await publisher.publish("worker-added", WorkerMetadata(
                uid=uid, address=f"10.1.0.{i + 1}:7000", pid=i + 1, version="test"))
            say(f"worker {uid}")
        say(f"ready {publisher.generation}")
        await anyio.sleep_forever()


if __name__ == "__main__":
    role, url, prefix, namespace, ttl = sys.argv[1:6]
    count = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    anyio.run(main, role, url, prefix, namespace, int(ttl), count)
