"""Generated sequences of claims, releases, borrows and publishes against a small model."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anywool import DiscoveryNamespaceInUse, DiscoveryNamespaceNotFound, LocalDiscovery

from ..helpers import worker

pytestmark = pytest.mark.anyio

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

operations = st.lists(
    st.one_of(
        st.just(("claim",)),
        st.just(("release",)),
        st.just(("borrow",)),
        st.just(("subscribe",)),
        st.tuples(st.just("publish"), st.integers(0, 3)),
        st.tuples(st.just("return"), st.integers(0, 3)),
    ),
    max_size=25,
)


@dataclass
class Borrowed:
    publisher: LocalDiscovery.Publisher
    generation: int
    workers: set[uuid.UUID] = field(default_factory=set)


@SETTINGS
@given(steps=operations)
async def test_claims_and_borrows_follow_the_single_owner_model(steps):
    namespace = f"model-{uuid.uuid4().hex}"
    owner: LocalDiscovery | None = None
    generation = 0
    borrowed: list[Borrowed] = []

    def registered() -> set[uuid.UUID]:
        return set().union(*(b.workers for b in borrowed if b.generation == generation))

    with anyio.fail_after(30):
        try:
            for step in steps:
                kind = step[0]
                if kind == "claim":
                    candidate = LocalDiscovery(namespace)
                    if owner is None:
                        owner = await candidate.__aenter__()
                        generation += 1
                    else:
                        with pytest.raises(DiscoveryNamespaceInUse):
                            await candidate.__aenter__()
                elif kind == "release" and owner is not None:
                    await owner.__aexit__(None, None, None)
                    owner = None
                elif kind == "borrow":
                    publisher = LocalDiscovery.Publisher(namespace)
                    if owner is None:
                        with pytest.raises(DiscoveryNamespaceNotFound):
                            await publisher.__aenter__()
                    else:
                        await publisher.__aenter__()
                        borrowed.append(Borrowed(publisher, generation))
                elif kind == "publish" and borrowed:
                    entry = borrowed[step[1] % len(borrowed)]
                    metadata = worker()
                    if owner is None:
                        with pytest.raises(DiscoveryNamespaceNotFound):
                            await entry.publisher.publish("worker-added", metadata)
                    else:
                        await entry.publisher.publish("worker-added", metadata)
                        if entry.generation != generation:  # an orphan rebinds to the successor
                            entry.generation, entry.workers = generation, set()
                        entry.workers.add(metadata.uid)
                elif kind == "return" and borrowed:
                    entry = borrowed.pop(step[1] % len(borrowed))
                    await entry.publisher.__aexit__(None, None, None)
                elif kind == "subscribe":
                    iterator = LocalDiscovery.Subscriber(namespace).__aiter__()
                    expected = registered()
                    try:
                        if owner is None:
                            with pytest.raises(DiscoveryNamespaceNotFound):
                                await iterator.__anext__()
                        else:
                            seen = {(await iterator.__anext__()).metadata.uid for _ in expected}
                            assert seen == expected
                            # Nothing else may follow: a marker published now must be the very
                            # next event (a stray event would come first).
                            async with LocalDiscovery.Publisher(namespace) as marking:
                                await marking.publish("worker-added", marker := worker())
                                following = await iterator.__anext__()
                                assert (following.type, following.metadata.uid) == (
                                    "worker-added", marker.uid)
                    finally:
                        await iterator.aclose()
        finally:
            # Not under a new shield: the owner's task group must exit in the scope it entered.
            for entry in borrowed:
                await entry.publisher.__aexit__(None, None, None)
            if owner is not None:
                await owner.__aexit__(None, None, None)


forests = st.lists(st.recursive(st.just([]), lambda children: st.lists(children, max_size=3),
                                max_leaves=8), min_size=1, max_size=3)


@SETTINGS
@given(forest=forests)
async def test_exactly_the_nested_claims_are_rejected(forest):
    namespace = f"forest-{uuid.uuid4().hex}"
    admitted = rejected = 0

    async def enter(children: list, depth: int) -> None:
        nonlocal admitted, rejected
        try:
            async with LocalDiscovery(namespace):
                admitted += 1
                for child in children:
                    await enter(child, depth + 1)
        except DiscoveryNamespaceInUse:
            assert depth > 0
            rejected += 1
            for child in children:  # the body of a rejected claim never ran: walk on regardless
                await enter(child, depth + 1)

    def count(children: list) -> int:
        return sum(1 + count(child) for child in children)

    with anyio.fail_after(30):
        for tree in forest:
            await enter(tree, 0)
    assert admitted == len(forest)
    assert rejected == sum(count(tree) for tree in forest)
