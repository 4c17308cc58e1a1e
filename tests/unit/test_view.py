"""One vocabulary for turning changes of workers into discovery events."""

from __future__ import annotations

from anywool.discovery import _view

from ..helpers import worker


def _kinds(events):
    return [(e.type, e.metadata.uid, e.metadata.pid) for e in events]


def test_event_for_reports_only_what_a_consumer_can_see():
    a = worker(pid=1)
    assert _view.event_for(None, None) is None
    assert _kinds([_view.event_for(None, a)]) == [("worker-added", a.uid, 1)]
    assert _view.event_for(a, worker(uid=a.uid, pid=1)) is None  # same fields: no event
    assert _kinds([_view.event_for(a, worker(uid=a.uid, pid=2))]) == [("worker-updated", a.uid, 2)]
    # A drop carries the metadata the view last had.
    assert _kinds([_view.event_for(a, None)]) == [("worker-dropped", a.uid, 1)]


def test_diff_drops_first_then_follows_the_new_order():
    a, b, c = worker(pid=1), worker(pid=1), worker(pid=1)
    old = {a.uid: a, b.uid: b}
    new = {c.uid: c, b.uid: worker(uid=b.uid, pid=5)}
    assert _kinds(_view.diff(old, new)) == [
        ("worker-dropped", a.uid, 1), ("worker-added", c.uid, 1), ("worker-updated", b.uid, 5)]
    assert _view.diff(new, new) == []


def test_replay_keeps_every_step_and_leaves_the_view_alone():
    a = worker(pid=1)
    view = {a.uid: a}
    transient = worker(pid=1)
    changes = [(a.uid, worker(uid=a.uid, pid=2)), (transient.uid, transient),
               (transient.uid, None), (a.uid, worker(uid=a.uid, pid=2)), (a.uid, None),
               (a.uid, None)]
    events = _view.replay(view, changes)
    assert _kinds(events) == [("worker-updated", a.uid, 2), ("worker-added", transient.uid, 1),
                              ("worker-dropped", transient.uid, 1), ("worker-dropped", a.uid, 2)]
    assert view == {a.uid: a} and view[a.uid].pid == 1
    _view.apply(view, events)
    assert view == {}
