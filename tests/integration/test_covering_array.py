"""WorkerPool over a covering array: pool mode × discovery form × load balancer form × lazy ×
worker backend (DESIGN §7, §9).

Factors and levels
------------------

``mode``
    ``owner_durable``: ``WorkerPool(discovery=<LocalDiscovery(ns) in form F>)`` owns ``ns`` and
    spawns nothing; a separate :class:`~anywool.LocalWorker` is published into ``ns`` by the
    test (``lazy``: from inside the block through ``pool.discovery.publisher``; ``eager``: from
    a concurrent task through ``LocalDiscovery.Publisher(ns)`` as soon as the namespace is
    claimed, while the pool's entry waits for its quorum).
    ``hybrid``: ``WorkerPool(spawn=1, discovery=<LocalDiscovery(ns) in form F>)``.
    ``durable_borrowed``: an owner pool ``WorkerPool(spawn=1, discovery=LocalDiscovery(ns))`` is
    entered first; the pool under test gets ``<LocalDiscovery.Subscriber(ns) in form F>``.
``discovery`` (the form F)
    ``instance``, ``callable`` (a lambda), ``class`` (a subclass bound to the row's namespace,
    defined in the test body, called with no arguments), ``awaitable`` (a coroutine object),
    ``sync_cm`` (``contextlib.contextmanager``), ``async_cm``
    (``contextlib.asynccontextmanager``).
``loadbalancer``
    ``lb_none`` (the pool's default), ``lb_instance``, ``lb_class`` (a no-argument subclass of
    :class:`~anywool.RoundRobinLoadBalancer`), ``lb_async_cm``. Every balancer the row makes
    counts its dispatches, so the test proves the resolved balancer is the one used.
``lazy``
    ``lazy`` / ``eager`` (``lazy=True`` / ``lazy=False``).
``worker``
    ``w_asyncio`` / ``w_trio``: the event loop of *the worker process that serves the row's
    call*, whoever starts it: the pool under test (``hybrid``, its ``backend=``), the external
    ``LocalWorker`` (``owner_durable``) or the owner pool (``durable_borrowed``). So the factor
    applies in every mode, there is no "not applicable" level, and no combination is illegal:
    :func:`legal` accepts every row (it stays the single predicate the builder and the guard
    share, and the pair arithmetic is unit-tested with a filter that does exclude rows). The
    level is checked on the serving process's command line (``--backend``).
    The ``w_`` prefix keeps it apart from the anyio backend running the test in test ids.

The context-manager forms need a choice: a context manager's result is taken as it is, never
entered again (:mod:`anywool.runtime.client._resolve`). So the ``async_cm`` form enters the
``LocalDiscovery`` itself (``async with LocalDiscovery(ns) as d: yield d``), and the ``sync_cm``
form, which cannot enter an async context manager, yields a ``LocalDiscovery`` that the test
entered around the pool (the case "a discovery its caller already entered stays the caller's":
the test also asserts the pool left it claimed and unexited). In ``durable_borrowed`` both
yield a plain ``LocalDiscovery.Subscriber``, which needs no entering.

Counting. Every context manager a row creates (the form's own manager, every
``LocalDiscovery``, the balancer's manager) is registered in the row's :class:`Ledger` when it
is created and counts its entries and exits; after everything is exited each one must read
exactly one entry and one exit. Each row builds all of its objects in the test body: nothing is
shared across rows, backends or retries.

Known intermittent failure (``owner_durable`` rows, anyio's asyncio backend, a few per cent of
runs): ``InvalidStateError: invalid state`` from ``Future.set_result(None)``, reported through the
event loop's exception handler. The external worker is withdrawn and then stopped while the pool
follows it; ``WorkerConnection.__aexit__`` cancels its reader's pending ``receive()`` in the loop
iteration in which the worker's EOF arrives, and anyio's raw UNIX socket reader callback
(``loop.add_reader(sock, f.set_result, None)``) then resolves the already cancelled future.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import anyio
import psutil
import pytest
from allpairspy import AllPairs

from anywool import (
    DiscoveryLike,
    DiscoverySubscriberLike,
    LocalDiscovery,
    LocalWorker,
    RoundRobinLoadBalancer,
    WorkerPool,
)
from tests.integration.routines import whoami

# -- the covering array ----------------------------------------------------------------------


class Row(NamedTuple):
    mode: str
    discovery: str
    loadbalancer: str
    lazy: str
    worker: str


FACTORS: dict[str, tuple[str, ...]] = {
    "mode": ("owner_durable", "hybrid", "durable_borrowed"),
    "discovery": ("instance", "callable", "class", "awaitable", "sync_cm", "async_cm"),
    "loadbalancer": ("lb_none", "lb_instance", "lb_class", "lb_async_cm"),
    "lazy": ("lazy", "eager"),
    "worker": ("w_asyncio", "w_trio"),
}
assert tuple(FACTORS) == Row._fields

Pair = tuple[tuple[str, str], tuple[str, str]]  # ((factor, level), (later factor, level))
Legal = Callable[[Sequence[str]], bool]


def legal(values: Sequence[str]) -> bool:
    """Whether a (possibly partial, leading) row of levels can be run.

    Every combination is legal under the levels above (see the module docstring); allpairspy
    also calls this on prefixes of a row while it builds one.
    """
    return True


def legal_rows(factors: Mapping[str, Sequence[str]], is_legal: Legal) -> list[tuple[str, ...]]:
    """Every full row of ``factors`` that ``is_legal`` accepts, in product order."""
    return [row for row in itertools.product(*factors.values()) if is_legal(row)]


def pairs_of(row: Sequence[str], names: Sequence[str]) -> set[Pair]:
    """The pairs of levels (across every two factors) that one row covers."""
    cells = list(zip(names, row))
    return {(cells[i], cells[j]) for i, j in itertools.combinations(range(len(cells)), 2)}


def required_pairs(factors: Mapping[str, Sequence[str]], is_legal: Legal) -> set[Pair]:
    """Every legal pair: the pairs that some legal full row contains."""
    names = list(factors)
    required: set[Pair] = set()
    for row in legal_rows(factors, is_legal):
        required |= pairs_of(row, names)
    return required


def missing_pairs(rows: Iterable[Sequence[str]], factors: Mapping[str, Sequence[str]],
                  is_legal: Legal) -> set[Pair]:
    """The legal pairs that no row of ``rows`` covers (empty: ``rows`` is a covering array)."""
    names = list(factors)
    covered: set[Pair] = set()
    for row in rows:
        covered |= pairs_of(row, names)
    return required_pairs(factors, is_legal) - covered


def top_up(rows: Sequence[Sequence[str]], factors: Mapping[str, Sequence[str]],
           is_legal: Legal) -> list[tuple[str, ...]]:
    """Legal rows to append so that ``rows`` covers every legal pair (greedy, deterministic:
    each added row is the first legal row in product order covering the most missing pairs)."""
    names = list(factors)
    missing = missing_pairs(rows, factors, is_legal)
    candidates = legal_rows(factors, is_legal)
    added: list[tuple[str, ...]] = []
    while missing:
        best = max(candidates, key=lambda row: len(pairs_of(row, names) & missing))
        added.append(best)
        missing -= pairs_of(best, names)
    return added


def build_array(factors: Mapping[str, Sequence[str]], is_legal: Legal
                ) -> tuple[list[tuple[str, ...]], int]:
    """The allpairspy rows, then a row for each legal pair allpairspy starved out.

    :returns: the rows, and how many of them allpairspy produced (the rest were appended).
    """
    generated = [tuple(row) for row in AllPairs([list(levels) for levels in factors.values()],
                                                filter_func=is_legal)]
    return generated + top_up(generated, factors, is_legal), len(generated)


_ROWS, ALLPAIRS_ROWS = build_array(FACTORS, legal)
ROWS = [Row(*row) for row in _ROWS]
APPENDED_ROWS = len(ROWS) - ALLPAIRS_ROWS


def row_id(row: Row) -> str:
    return "-".join(row)


# -- the guard -------------------------------------------------------------------------------


def test_the_covering_array_contains_every_legal_pair_and_only_legal_rows() -> None:
    assert missing_pairs(ROWS, FACTORS, legal) == set()
    assert all(legal(row) for row in ROWS)
    assert len(set(ROWS)) == len(ROWS), "a row is repeated"
    assert all(level in FACTORS[name] for row in ROWS for name, level in zip(Row._fields, row))
    # Far fewer rows than the full product, else there is no point in a covering array.
    assert len(ROWS) < len(legal_rows(FACTORS, legal)) // 4


def test_the_pair_check_detects_a_pair_missing_from_the_array() -> None:
    dropped = (("mode", "owner_durable"), ("discovery", "sync_cm"))
    incomplete = [row for row in ROWS if not (row.mode == "owner_durable"
                                              and row.discovery == "sync_cm")]
    assert dropped in missing_pairs(incomplete, FACTORS, legal)
    # and topping the incomplete array up restores full coverage
    assert missing_pairs(incomplete + top_up(incomplete, FACTORS, legal), FACTORS, legal) == set()


def test_the_pair_check_on_a_small_array_with_an_illegal_combination() -> None:
    toy = {"a": ("a1", "a2"), "b": ("b1", "b2"), "c": ("c1", "c2")}

    def no_a1_with_b2(values: Sequence[str]) -> bool:
        return not (len(values) >= 2 and values[0] == "a1" and values[1] == "b2")

    rows = [("a1", "b1", "c1"), ("a2", "b2", "c2")]
    assert missing_pairs(rows, toy, lambda values: True) == {
        (("a", "a1"), ("b", "b2")), (("a", "a2"), ("b", "b1")),
        (("a", "a1"), ("c", "c2")), (("a", "a2"), ("c", "c1")),
        (("b", "b1"), ("c", "c2")), (("b", "b2"), ("c", "c1")),
    }
    # (a1, b2) is in no legal row, so it is not required
    assert missing_pairs(rows, toy, no_a1_with_b2) == {
        (("a", "a2"), ("b", "b1")), (("a", "a1"), ("c", "c2")), (("a", "a2"), ("c", "c1")),
        (("b", "b1"), ("c", "c2")), (("b", "b2"), ("c", "c1")),
    }
    built, generated = build_array(toy, no_a1_with_b2)
    assert all(no_a1_with_b2(row) for row in built)
    assert missing_pairs(built, toy, no_a1_with_b2) == set()


def test_the_builder_appends_rows_for_the_pairs_allpairspy_starves_out() -> None:
    # With this filter allpairspy stops early (its rows miss legal pairs): the top-up fills in.
    toy = {"a": ("a1", "a2", "a3"), "b": ("b1", "b2", "b3"), "c": ("c1", "c2")}

    def no_a1_with_b2(values: Sequence[str]) -> bool:
        return not (len(values) >= 2 and values[0] == "a1" and values[1] == "b2")

    built, generated = build_array(toy, no_a1_with_b2)
    assert missing_pairs(built[:generated], toy, no_a1_with_b2) != set()
    assert len(built) > generated
    assert all(no_a1_with_b2(row) for row in built)
    assert missing_pairs(built, toy, no_a1_with_b2) == set()


# -- counting ------------------------------------------------------------------------------


class Counts:
    def __init__(self, name: str) -> None:
        self.name = name
        self.entered = 0
        self.exited = 0

    def __repr__(self) -> str:
        return f"{self.name}: entered {self.entered}, exited {self.exited}"


class Ledger:
    """Every context manager one row created, and the row's dispatch counts."""

    def __init__(self) -> None:
        self.managers: list[Counts] = []
        self.dispatches = 0
        self.claimed = anyio.Event()  # set when a LocalDiscovery of the row claimed the namespace

    def new(self, name: str) -> Counts:
        counts = Counts(name)
        self.managers.append(counts)
        return counts

    def names(self) -> list[str]:
        return sorted(counts.name for counts in self.managers)

    def unbalanced(self) -> list[Counts]:
        return [c for c in self.managers if (c.entered, c.exited) != (1, 1)]


class CountingLocalDiscovery(LocalDiscovery):
    """A LocalDiscovery that counts its entries and exits in the row's ledger."""

    def __init__(self, namespace: str, ledger: Ledger) -> None:
        super().__init__(namespace)
        self._ledger = ledger
        self.counts = ledger.new("LocalDiscovery")

    async def __aenter__(self) -> CountingLocalDiscovery:
        self.counts.entered += 1
        await super().__aenter__()
        self._ledger.claimed.set()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        self.counts.exited += 1
        return await super().__aexit__(*exc_info)


class CountingBalancer(RoundRobinLoadBalancer):
    def __init__(self, ledger: Ledger) -> None:
        super().__init__()
        self._ledger = ledger

    async def dispatch(self, workers: Any, send: Any) -> Any:
        self._ledger.dispatches += 1
        return await super().dispatch(workers, send)


def counted_sync_cm(ledger: Ledger, name: str, value: object) -> contextlib.AbstractContextManager[object]:
    counts = ledger.new(name)

    @contextlib.contextmanager
    def manage() -> Iterator[object]:
        counts.entered += 1
        try:
            yield value
        finally:
            counts.exited += 1

    return manage()


def counted_async_cm(ledger: Ledger, name: str, make: Callable[[], object]
                     ) -> contextlib.AbstractAsyncContextManager[object]:
    """An async context manager yielding ``make()``, entering it first if it is an async CM."""
    counts = ledger.new(name)

    @contextlib.asynccontextmanager
    async def manage() -> AsyncIterator[object]:
        counts.entered += 1
        try:
            value = make()
            if hasattr(type(value), "__aenter__"):
                async with value as entered:  # type: ignore[attr-defined]
                    yield entered
            else:
                yield value
        finally:
            counts.exited += 1

    return manage()


async def _produce(make: Callable[[], object]) -> object:
    await anyio.lowlevel.checkpoint()
    return make()


# -- the forms -----------------------------------------------------------------------------


def discovery_in_form(form: str, make: Callable[[], object], bound_class: type,
                      ledger: Ledger, entered_by_test: object | None) -> object:
    """``make()``'s object in Factory form ``form``.

    :param bound_class: a class that, called with no arguments, makes the object.
    :param entered_by_test: for ``sync_cm`` (owner modes): the LocalDiscovery the test entered.
    """
    if form == "instance":
        return make()
    if form == "callable":
        return lambda: make()
    if form == "class":
        return bound_class
    if form == "awaitable":
        return _produce(make)
    if form == "sync_cm":
        return counted_sync_cm(ledger, "discovery sync_cm",
                               make() if entered_by_test is None else entered_by_test)
    assert form == "async_cm"
    return counted_async_cm(ledger, "discovery async_cm", make)


def balancer_in_form(form: str, ledger: Ledger) -> object:
    class BoundBalancer(CountingBalancer):
        def __init__(self) -> None:
            super().__init__(ledger)

    if form == "lb_none":
        return None
    if form == "lb_instance":
        return CountingBalancer(ledger)
    if form == "lb_class":
        return BoundBalancer
    assert form == "lb_async_cm"
    return counted_async_cm(ledger, "loadbalancer async_cm", lambda: CountingBalancer(ledger))


def expected_managers(row: Row) -> list[str]:
    names = []
    if row.mode != "durable_borrowed":
        names.append("LocalDiscovery")
    if row.discovery in ("sync_cm", "async_cm"):
        names.append(f"discovery {row.discovery}")
    if row.loadbalancer == "lb_async_cm":
        names.append("loadbalancer async_cm")
    return sorted(names)


def backend_of(pid: int) -> str:
    command = psutil.Process(pid).cmdline()
    return command[command.index("--backend") + 1]


# -- the rows --------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("row", ROWS, ids=row_id)
async def test_pool_dispatches_to_the_expected_worker(row: Row, namespace: str) -> None:
    ledger = Ledger()
    with anyio.fail_after(60):
        served, expected, backend = await _run(row, namespace, ledger)
    assert served == expected, f"the call was served by pid {served}, not by pid {expected}"
    assert backend == row.worker.removeprefix("w_")
    assert ledger.names() == expected_managers(row)
    assert ledger.unbalanced() == [], "each context manager is entered once and exited once"
    assert ledger.dispatches == (0 if row.loadbalancer == "lb_none" else 1)
    assert not psutil.pid_exists(expected), "the serving worker outlived the test's pools"


async def _run(row: Row, namespace: str, ledger: Ledger) -> tuple[int, int, str]:
    """Run one row; (pid that served the call, pid expected to, backend of that worker)."""
    worker_backend = row.worker.removeprefix("w_")
    options: dict[str, Any] = dict(
        loadbalancer=balancer_in_form(row.loadbalancer, ledger),
        lazy=row.lazy == "lazy",
        quorum_timeout=30,
    )
    if row.mode == "durable_borrowed":
        return await _run_borrowed(row, namespace, ledger, worker_backend, options)

    class BoundDiscovery(CountingLocalDiscovery):
        def __init__(self) -> None:
            super().__init__(namespace, ledger)

    async with contextlib.AsyncExitStack() as outside:
        entered_by_test = None
        if row.discovery == "sync_cm":
            entered_by_test = await outside.enter_async_context(
                CountingLocalDiscovery(namespace, ledger))
        discovery = discovery_in_form(row.discovery, lambda: CountingLocalDiscovery(namespace, ledger),
                                      BoundDiscovery, ledger, entered_by_test)
        if row.mode == "hybrid":
            result = await _run_hybrid(namespace, discovery, worker_backend, options)
        else:
            result = await _run_owner_durable(row, namespace, discovery, ledger, worker_backend,
                                              options)
        if entered_by_test is not None:
            # the pool used, and never exited, the discovery its caller entered
            assert entered_by_test.claimed
            assert entered_by_test.counts.exited == 0
    return result


def _check_owned(pool: WorkerPool, namespace: str) -> None:
    assert isinstance(pool.discovery, CountingLocalDiscovery)
    assert pool.discovery.namespace == namespace
    assert pool.discovery.claimed


async def _run_hybrid(namespace: str, discovery: object, backend: str, options: dict[str, Any]
                      ) -> tuple[int, int, str]:
    async with WorkerPool(spawn=1, discovery=discovery, backend=backend, **options) as pool:
        _check_owned(pool, namespace)
        [worker] = pool.workers
        served = await whoami()
        return served, worker.pid, backend_of(served)


async def _run_owner_durable(row: Row, namespace: str, discovery: object, ledger: Ledger,
                             backend: str, options: dict[str, Any]) -> tuple[int, int, str]:
    if row.lazy == "lazy":
        async with WorkerPool(discovery=discovery, **options) as pool:
            _check_owned(pool, namespace)
            assert pool.workers == []
            async with LocalWorker(backend=backend) as worker, \
                    pool.discovery.publisher as publisher:
                await publisher.publish("worker-added", worker.metadata)
                served = await whoami()
                return served, worker.pid, backend_of(served)

    # eager: the pool's entry waits for its quorum, so the worker is published by a concurrent
    # task as soon as the pool has claimed the namespace
    release, done = anyio.Event(), anyio.Event()
    external: list[LocalWorker] = []
    result: tuple[int, int, str] | None = None

    async def publish_a_worker() -> None:
        try:
            await ledger.claimed.wait()
            async with LocalWorker(backend=backend) as worker, \
                    LocalDiscovery.Publisher(namespace) as publisher:
                external.append(worker)
                await publisher.publish("worker-added", worker.metadata)
                await release.wait()
        finally:
            done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(publish_a_worker)
        async with WorkerPool(discovery=discovery, **options) as pool:
            _check_owned(pool, namespace)
            assert pool.workers == []
            [worker] = external  # the quorum was met, so the worker was published
            served = await whoami()
            result = served, worker.pid, backend_of(served)
            release.set()
            await done.wait()  # withdrawn and stopped while the pool still owns the namespace
    assert result is not None
    return result


async def _run_borrowed(row: Row, namespace: str, ledger: Ledger, backend: str,
                        options: dict[str, Any]) -> tuple[int, int, str]:
    class BoundSubscriber(LocalDiscovery.Subscriber):
        def __init__(self) -> None:
            super().__init__(namespace)

    discovery = discovery_in_form(row.discovery, lambda: LocalDiscovery.Subscriber(namespace),
                                  BoundSubscriber, ledger, None)
    async with WorkerPool(spawn=1, discovery=LocalDiscovery(namespace), backend=backend) as owner:
        [worker] = owner.workers
        async with WorkerPool(discovery=discovery, **options) as pool:
            assert not isinstance(pool.discovery, DiscoveryLike)
            assert isinstance(pool.discovery, DiscoverySubscriberLike)
            assert isinstance(pool.discovery, LocalDiscovery.Subscriber)
            assert pool.discovery.namespace == namespace
            assert pool.workers == []
            served = await whoami()
            return served, worker.pid, backend_of(served)

