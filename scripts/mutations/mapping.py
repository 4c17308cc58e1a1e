"""Mutations of anywool.map's promises (batches sized by the work, the bound on batches held,
order, laziness, the first exception, interruption of a batch) and of a call's budget of
Python function calls."""

from mutate import Mutation

_MAP = "src/anywool/runtime/_map.py"
_BATCH = "src/anywool/runtime/_batch.py"
_T = "tests/integration/test_map.py::"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="map-one-item-per-call",
        path=_MAP,
        old="        if not self._measured_items:\n            return 1",
        new="        if True:\n            return 1",
        tests=(f"{_T}test_results_come_in_the_inputs_order_and_many_items_go_in_one_call",),
        why="small items go many to a call",
    ),
    Mutation(
        name="map-slot-freed-when-a-batch-returns",
        path=_MAP,
        old="        self._running -= 1\n",
        new="        self._running -= 1\n        self._free += 1\n",
        tests=(f"{_T}test_an_item_that_has_not_ended_holds_back_at_most_max_in_flight_batches",),
        why="batches held (running or waiting to be consumed) are bounded by max_in_flight",
    ),
    Mutation(
        name="map-yields-as-batches-finish-when-ordered",
        path=_MAP,
        old="        if self._ordered:\n            self._done[start] = (origin, results)",
        new="        if False:\n            self._done[start] = (origin, results)",
        tests=(f"{_T}test_results_come_in_the_inputs_order_and_many_items_go_in_one_call",),
        why="ordered results follow the input's order",
    ),
    Mutation(
        name="map-reads-the-whole-input-first",
        path=_MAP,
        old="            items = list(itertools.islice(source, size))",
        new="            items = list(source)",
        tests=(f"{_T}test_the_input_is_read_lazily",),
        why="the input is read a batch at a time",
    ),
    Mutation(
        name="map-failure-lets-the-others-run",
        path=_MAP,
        old="            if self._batches is not None:\n                self._batches.cancel_scope.cancel()",
        new="            pass",
        tests=(f"{_T}test_the_first_exception_cancels_the_batches_still_running",),
        why="the first exception ends the map at once (the rest cancelled, not waited for)",
    ),
    Mutation(
        name="map-exception-without-its-item",
        path=_BATCH,
        old="    except Exception as exc:\n        _note(exc, index)\n        raise\n    return results, clock() - began\n\n\nasync def",
        new="    except Exception as exc:\n        raise\n    return results, clock() - began\n\n\nasync def",
        tests=(f"{_T}test_the_first_exception_is_raised_with_its_type_and_names_its_item",),
        why="an item's exception names the item",
    ),
    Mutation(
        name="map-batch-loop-not-interruptible",
        path="src/anywool/runtime/worker/_interrupt.py",
        old="_ROUTINE_CODE = frozenset({_INVOKE, *_batch.LOOPS})",
        new="_ROUTINE_CODE = frozenset({_INVOKE})",
        tests=(f"{_T}test_a_batch_of_a_c_function_is_interrupted_too",),
        why="a batch of a C function is interrupted in the loop's own frame",
    ),
    Mutation(
        name="map-routine-partial-dispatched-again",
        path=_BATCH,
        old="    if isinstance(fn, functools.partial) and is_routine(fn.func):",
        new="    if False:",
        tests=(f"{_T}test_cancelling_the_block_interrupts_a_batch_mid_way_on_its_worker",),
        why="a partial of a routine runs the routine's body in the batch, not a nested call",
    ),
    Mutation(
        name="map-batch-runs-past-its-budget",
        path=_BATCH,
        old="    until = began + budget\n    results: list[Any] = []\n    append = results.append\n"
            "    index = start\n    try:\n        for item in items:\n            append(fn(item))",
        new="    until = began + 1e9\n    results: list[Any] = []\n    append = results.append\n"
            "    index = start\n    try:\n        for item in items:\n            append(fn(item))",
        tests=(f"{_T}test_items_that_become_slower_still_spread_over_the_workers",),
        why="a batch past its budget gives back the items it has not started",
    ),
    Mutation(
        name="map-one-waiter-at-a-time",
        path=_MAP,
        old="        if self._changed is None:\n            self._changed = anyio.Event()",
        new="        if True:\n            self._changed = anyio.Event()",
        tests=(f"{_T}test_several_tasks_share_the_results",),
        why="every task waiting for results is woken",
    ),
    Mutation(
        name="map-size-ignores-bytes",
        path=_MAP,
        old="        if self._item_bytes * size > MAX_BATCH_BYTES:",
        new="        if False:",
        tests=(f"{_T}test_large_items_are_batched_within_a_frame",),
        why="a batch stays within a frame",
    ),
    Mutation(
        name="map-stop-async-iteration-ends-it",
        path=_MAP,
        old="        if isinstance(failure, (StopIteration, StopAsyncIteration)):",
        new="        if False:",
        tests=(f"{_T}test_an_item_raising_stop_async_iteration_does_not_end_the_map_quietly",),
        why="an item's StopAsyncIteration does not end the iteration as if the map were done",
    ),
    Mutation(
        name="a-call-does-more-work",
        path="src/anywool/runtime/client/_proxy.py",
        old="        with self._in_flight:\n            # The built-in balancer's choice",
        new="        for _ in range(12):\n            _telemetry.current()\n"
            "        with self._in_flight:\n            # The built-in balancer's choice",
        tests=("tests/integration/test_call_budget.py",),
        why="a change that adds per-call work has to move the budget",
    ),
    Mutation(
        name="a-worker-does-more-work-per-call",
        path="src/anywool/runtime/worker/_server.py",
        old="            waited = time.perf_counter() - call.read_at\n",
        new="            waited = time.perf_counter() - call.read_at\n"
            "            for _ in range(12):\n                _telemetry.current()\n",
        tests=("tests/integration/test_call_budget.py",),
        why="a change that adds per-call work on the worker has to move the budget",
    ),
]
