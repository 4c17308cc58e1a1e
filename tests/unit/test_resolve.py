"""anywool.resolved: every Factory form, entered and exited exactly once."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest

from anywool import DiscoveryLike, DiscoverySubscriberLike, LocalDiscovery, resolved

pytestmark = pytest.mark.anyio


class Value:
    """The object every form below produces."""


class Counts:
    def __init__(self) -> None:
        self.entered = 0
        self.exited = 0
        self.exit_saw: list[type[BaseException] | None] = []


def sync_cm(counts: Counts, value: object) -> contextlib.AbstractContextManager[object]:
    @contextlib.contextmanager
    def manage() -> Iterator[object]:
        counts.entered += 1
        try:
            yield value
        except BaseException as exc:
            counts.exit_saw.append(type(exc))
            raise
        else:
            counts.exit_saw.append(None)
        finally:
            counts.exited += 1

    return manage()


def async_cm(counts: Counts, value: object) -> contextlib.AbstractAsyncContextManager[object]:
    @contextlib.asynccontextmanager
    async def manage() -> AsyncIterator[object]:
        counts.entered += 1
        try:
            yield value
        except BaseException as exc:
            counts.exit_saw.append(type(exc))
            raise
        else:
            counts.exit_saw.append(None)
        finally:
            counts.exited += 1

    return manage()


async def _produce(value: object) -> object:
    await anyio.lowlevel.checkpoint()
    return value


FORMS = ["instance", "callable", "class", "awaitable", "sync_cm", "async_cm"]


def make(form: str, value: Value, counts: Counts) -> object:
    if form == "instance":
        return value
    if form == "callable":
        return lambda: value
    if form == "class":
        return type(value)
    if form == "awaitable":
        return _produce(value)
    if form == "sync_cm":
        return sync_cm(counts, value)
    return async_cm(counts, value)


@pytest.mark.parametrize("form", FORMS)
async def test_every_form_resolves_to_its_value_and_enters_at_most_once(form: str) -> None:
    counts, value = Counts(), Value()
    with anyio.fail_after(5):
        async with resolved(make(form, value, counts), expect=Value) as obj:
            assert isinstance(obj, Value)
            if form != "class":
                assert obj is value
            entered_inside = counts.entered
    manages = form.endswith("_cm")
    assert (entered_inside, counts.entered, counts.exited) == ((1, 1, 1) if manages else (0, 0, 0))


@pytest.mark.parametrize("form", ["sync_cm", "async_cm"])
async def test_a_context_manager_is_exited_once_with_the_bodys_exception(form: str) -> None:
    counts = Counts()
    with anyio.fail_after(5), pytest.raises(KeyError, match="body"):
        async with resolved(make(form, Value(), counts), expect=Value):
            raise KeyError("body")
    assert (counts.entered, counts.exited, counts.exit_saw) == (1, 1, [KeyError])


@pytest.mark.parametrize("form", ["sync_cm", "async_cm"])
async def test_a_rejected_result_is_exited_once_and_the_error_names_the_expected_types(form: str) -> None:
    counts = Counts()
    with anyio.fail_after(5), pytest.raises(TypeError) as info:
        async with resolved(make(form, Value(), counts), expect=(DiscoveryLike, DiscoverySubscriberLike),
                            name="discovery"):
            pytest.fail("the body must not run")
    assert (counts.entered, counts.exited, counts.exit_saw) == (1, 1, [TypeError])
    message = str(info.value)
    assert message.startswith("discovery must resolve to a DiscoveryLike or DiscoverySubscriberLike")


async def test_an_awaitable_producing_a_context_manager_has_it_entered() -> None:
    counts = Counts()
    value = Value()

    async def factory() -> object:
        return async_cm(counts, value)

    with anyio.fail_after(5):
        async with resolved(factory, expect=Value) as obj:
            assert obj is value
            assert (counts.entered, counts.exited) == (1, 0)
    assert (counts.entered, counts.exited) == (1, 1)


async def test_what_a_context_manager_yields_is_taken_as_it_is() -> None:
    # A context manager yielding a callable: the callable is the value, it is not called.
    def marker() -> None:
        raise AssertionError("never called")

    counts = Counts()
    with anyio.fail_after(5):
        async with resolved(sync_cm(counts, marker)) as obj:
            assert obj is marker


async def test_a_factory_that_raises_exits_what_was_entered_before() -> None:
    outer = Counts()

    class Exploding:
        def __enter__(self) -> object:
            raise LookupError("entering failed")

        def __exit__(self, *exc_info: object) -> None:
            raise AssertionError("never entered, so never exited")

    with anyio.fail_after(5), pytest.raises(LookupError, match="entering failed"):
        async with resolved(async_cm(outer, Value())):
            async with resolved(lambda: Exploding()):
                pass
    assert (outer.entered, outer.exited, outer.exit_saw) == (1, 1, [LookupError])


async def test_an_already_entered_discovery_is_taken_as_it_is(namespace: str) -> None:
    with anyio.fail_after(10):
        async with LocalDiscovery(namespace) as discovery:
            async with resolved(discovery, expect=DiscoveryLike,
                                is_value=lambda obj: getattr(obj, "claimed", False)) as obj:
                assert obj is discovery
            assert discovery.claimed  # not exited by resolved


async def test_forms_nesting_too_deep_are_refused() -> None:
    factory: object = Value()
    for _ in range(9):
        factory = (lambda inner: lambda: inner)(factory)
    with anyio.fail_after(5), pytest.raises(TypeError, match="nests more than 8 levels"):
        async with resolved(factory):
            pass


async def test_a_resolved_context_is_single_use() -> None:
    context = resolved(Value())
    with anyio.fail_after(5):
        async with context:
            pass
        with pytest.raises(RuntimeError, match="single-use"):
            async with context:
                pass
