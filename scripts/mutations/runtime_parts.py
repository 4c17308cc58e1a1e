"""Mutations of what the runtime's parts promise each other: the proxy's queue of calls waiting
for room (order, spares, a cancelled waiter's wake-up), and the pool's process speaking to its
workers through their contract alone."""

from mutate import Mutation

_ROOM = "src/anywool/runtime/client/_room.py"
_T = "tests/unit/test_room.py::"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="room-wakes-the-newest-waiter",
        path=_ROOM,
        old="            room = next(iter(waiters), None)",
        new="            room = next(reversed(waiters), None)",
        tests=(f"{_T}test_each_announcement_wakes_the_longest_waiting_call",),
        why="calls waiting for room go in the order they began to wait",
    ),
    Mutation(
        name="room-serves-the-back-before-the-front",
        path=_ROOM,
        old="        for waiters in (self.front, self.back):",
        new="        for waiters in (self.back, self.front):",
        tests=(f"{_T}test_calls_woken_before_are_served_first",),
        why="a call woken before, that found the room gone, is served first",
    ),
    Mutation(
        name="room-spares-unbounded",
        path=_ROOM,
        old="        self.spare = min(self.spare + 1, len(self._workers))",
        new="        self.spare = self.spare + 1",
        tests=(f"{_T}test_a_room_nobody_waits_for_is_kept_as_a_spare_at_most_once_per_worker",),
        why="at most one spare room per worker",
    ),
    Mutation(
        name="room-lost-with-a-cancelled-waiter",
        path=_ROOM,
        old="                self.announce()  # woken, but leaving: the place goes to the next waiter",
        new="                pass",
        tests=(f"{_T}test_a_waiter_cancelled_after_its_wake_up_passes_it_to_the_next",),
        why="a cancelled waiter's wake-up goes to the next waiter",
    ),
    Mutation(
        name="pool-imports-the-worker-server",
        path="src/anywool/runtime/pool/_local_worker.py",
        old="from anywool.runtime.wire._peer import PEER_GONE\n",
        new="from anywool.runtime.wire._peer import PEER_GONE\n"
            "from anywool.runtime.worker._server import Server  # noqa: F401\n",
        tests=("tests/integration/test_pool_imports.py::"
               "test_a_pools_process_imports_the_worker_contract_and_nothing_else_of_a_worker",),
        why="a pool's process imports nothing of a worker but the contract",
    ),
]
