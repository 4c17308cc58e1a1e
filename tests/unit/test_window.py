"""How many calls a connection lets wait to start on its worker (see WorkerConnection.busy):
the rule applied to the start delays the worker reports, without a worker."""

from __future__ import annotations

import pytest

from anywool.runtime.client import _connection
from anywool.runtime.client._call import Call
from anywool.runtime.client._connection import WorkerConnection


def _settled(connection: WorkerConnection, started: float) -> None:
    call = Call(connection, 1, "routine", quiet_ack=True)
    call.waiting = call.running = True
    connection._unstarted += 1
    connection._running += 1
    connection._settle(call, started=started)


def _connection_with_window(window: int) -> WorkerConnection:
    connection = WorkerConnection("unix:/nowhere")
    connection._window = window
    return connection


def test_a_new_connection_lets_one_call_wait() -> None:
    assert WorkerConnection("unix:/nowhere")._window == _connection.INITIAL_WINDOW == 1


@pytest.mark.parametrize("started", [0.0, 0.001, 0.002])
def test_a_prompt_start_lets_one_more_call_wait(started: float) -> None:
    connection = _connection_with_window(10)
    _settled(connection, started)
    assert connection._window == 11


def test_the_window_grows_up_to_64() -> None:
    connection = _connection_with_window(1)
    for _ in range(100):
        _settled(connection, 0.0)
    assert connection._window == _connection.WINDOW_MAX == 64


@pytest.mark.parametrize("started", [0.0021, 0.01, 0.02])
def test_a_start_a_burst_delays_leaves_the_window_as_it_is(started: float) -> None:
    connection = _connection_with_window(40)
    _settled(connection, started)
    assert connection._window == 40


@pytest.mark.parametrize(("started", "window"), [(0.0201, 39), (0.2, 4), (0.4, 2), (5.0, 1)])
def test_a_start_held_over_20_ms_shrinks_the_window_in_proportion(
        started: float, window: int) -> None:
    connection = _connection_with_window(40)
    _settled(connection, started)
    assert connection._window == window


def test_a_full_window_makes_the_connection_busy_until_a_call_starts() -> None:
    connection = _connection_with_window(2)
    calls = []
    for call_id in (1, 2):
        call = Call(connection, call_id, "routine", quiet_ack=True)
        call.waiting = call.running = True
        connection._unstarted += 1
        connection._running += 1
        calls.append(call)
    assert connection.busy
    connection._settle(calls[0], started=0.01)  # a burst's delay: the window stays 2
    assert not connection.busy
    connection._settle(calls[1], started=0.0)
    assert connection._window == 3
