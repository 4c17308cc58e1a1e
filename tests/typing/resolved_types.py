"""Checked by pyright in tests/unit/test_typing.py, never imported by pytest."""

from typing import assert_type

from anywool import DiscoveryLike, DiscoverySubscriberLike, LocalDiscovery, resolved


async def single_type(factory: object) -> None:
    async with resolved(factory, expect=DiscoveryLike) as discovery:
        assert_type(discovery, DiscoveryLike)


async def tuple_of_types(factory: LocalDiscovery) -> None:
    async with resolved(factory, expect=(DiscoveryLike, DiscoverySubscriberLike)) as discovery:
        assert_type(discovery, LocalDiscovery)


async def no_expectation(factory: int) -> None:
    async with resolved(factory) as value:
        assert_type(value, int)
