"""Reading a runtime directory (``_survey``): states, names, workers and leases, read without
changing anything; and reclaiming only what is dead."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from anywool.discovery.local import _binding, _claim, _survey

from ..helpers import colliding_names, leftover, owned, worker


@contextlib.contextmanager
def publishing(namespace: str, count: int) -> Iterator[_binding.Lease]:
    """A publisher of ``count`` workers; it goes (lease released) afterwards."""
    binding = _binding.bind(namespace)
    try:
        lease = binding.open_lease()
        try:
            for _ in range(count):
                binding.publish("worker-added", worker(), lease.id, lock_timeout=5)
            yield lease
        finally:
            lease.release()
    finally:
        binding.close()


def dead_owner(namespace: str) -> str:
    """A generation whose owner died: the files stay, the kernel lock is gone. Its entry."""
    claim = _claim.claim(namespace, capacity=4, block_size=256)
    claim.forget()  # closes its descriptors as its death would
    return claim.path.name


def test_a_live_owner_its_workers_and_their_leases(namespace: str) -> None:
    with owned(namespace) as claim, publishing(namespace, 2) as lease:
        (state,) = _survey.survey().namespaces
        assert (state.entry, state.name, state.state, state.reclaimable) == \
            (claim.path.name, namespace, "live", False)
        assert (state.owner_pid, state.capacity, state.block_size) == (os.getpid(), 4, 256)
        assert state.changes == 2 and state.error is None
        assert state.workers is not None and len(state.workers) == 2
        assert {(w.lease, w.publisher_alive) for w in state.workers} == {(lease.id.hex(), True)}
        assert state.leases == (_survey.LeaseState(lease.id.hex(), True, 2),)
        assert _survey.find(namespace) == state


def test_a_released_lease_is_a_dead_publisher(namespace: str) -> None:
    with owned(namespace):
        with publishing(namespace, 1) as lease:
            pass  # released without withdrawing: the owner's reaper has not run
        state = _survey.find(namespace)
        assert state is not None and state.workers is not None
        assert [(w.lease, w.publisher_alive) for w in state.workers] == [(lease.id.hex(), False)]
        assert state.leases == (_survey.LeaseState(lease.id.hex(), False, 1),)


def test_a_retired_generation_is_retiring_until_removed(namespace: str) -> None:
    with owned(namespace) as claim:
        claim.retire()
        state = _survey.find(namespace)
        assert state is not None and (state.state, state.reclaimable) == ("retiring", False)
    assert _survey.find(namespace) is None


def test_a_dead_owner_is_dead_and_reclaimed_with_its_name(namespace: str,
                                                          runtime_dir: Path) -> None:
    entry = dead_owner(namespace)
    state = _survey.find(namespace)
    assert state is not None
    assert (state.entry, state.name, state.state, state.reclaimable) == \
        (entry, namespace, "dead", True)
    assert _survey.reclaim(namespace=namespace) == [
        _claim.Swept(entry, "dead-namespace", namespace)]
    assert os.listdir(runtime_dir) == []
    assert _survey.find(namespace) is None


def test_a_live_owner_is_never_reclaimed(namespace: str, runtime_dir: Path) -> None:
    with owned(namespace) as claim:
        assert _survey.reclaim(namespace=namespace) == []
        assert _survey.reclaim() == []
        assert os.listdir(runtime_dir) == [claim.path.name]


def test_without_its_recorded_name_a_generation_is_found_by_its_entry(
        namespace: str, runtime_dir: Path) -> None:
    entry = dead_owner(namespace)
    os.unlink(runtime_dir / entry / "name")
    state = _survey.find(entry)
    assert state is not None and (state.entry, state.name, state.key) == \
        (entry, None, entry[len("ns-"):])
    assert _survey.find(namespace) == state  # the registry's digest still says whose it is
    assert _survey.reclaim(namespace=entry) == [_claim.Swept(entry, "dead-namespace", None)]
    assert os.listdir(runtime_dir) == []


def test_a_name_that_does_not_hash_to_the_registry_digest_is_not_believed(
        namespace: str, runtime_dir: Path) -> None:
    with owned(namespace) as claim:
        (claim.path / "name").write_text("someone-else")
        (state,) = _survey.survey().namespaces
        assert state.name is None


def test_abandoned_claimants_and_removers_are_reclaimed_once_a_second_old(
        runtime_dir: Path) -> None:
    old_tmp = leftover(runtime_dir, "tmp-")
    young_tmp = leftover(runtime_dir, "tmp-", age=0)
    old_dead = leftover(runtime_dir, "dead-")
    states = {s.entry: (s.state, s.reclaimable) for s in _survey.survey().namespaces}
    assert states == {old_tmp: ("abandoned", True), young_tmp: ("abandoned", False),
                      old_dead: ("abandoned", True)}
    swept = {(s.entry, s.kind) for s in _survey.reclaim()}
    assert swept == {(old_tmp, "killed-claimant"), (old_dead, "unfinished-removal")}
    assert os.listdir(runtime_dir) == [young_tmp]
    os.rmdir(runtime_dir / young_tmp)


def test_a_locked_claimant_directory_is_claiming_and_left_alone(runtime_dir: Path) -> None:
    entry = leftover(runtime_dir, "tmp-")
    fd = os.open(runtime_dir / entry, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        (state,) = _survey.survey().namespaces
        assert (state.state, state.reclaimable, state.workers) == ("claiming", False, None)
        assert _survey.reclaim(namespace=entry) == []
        assert _survey.reclaim() == []
    finally:
        os.close(fd)
    assert _survey.reclaim(namespace=entry) == [_claim.Swept(entry, "killed-claimant", None)]


def test_worker_socket_directories_alive_and_dead(runtime_dir: Path) -> None:
    dead = leftover(runtime_dir, "w-")
    alive = leftover(runtime_dir, "w-")
    fd = os.open(runtime_dir / alive, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        sockets = {s.entry: s for s in _survey.survey().sockets}
        assert sockets == {dead: _survey.WorkerSocket(dead, False, True),
                           alive: _survey.WorkerSocket(alive, True, False)}
        assert _survey.reclaim() == [_claim.Swept(dead, "worker-socket", None)]
    finally:
        os.close(fd)
    os.rmdir(runtime_dir / alive)


def test_a_registry_locked_by_another_open_file_description_is_not_read(
        namespace: str) -> None:
    with owned(namespace) as claim, publishing(namespace, 1):
        fd = os.open(claim.path / "registry", os.O_RDONLY)  # its own open file description
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            started = time.monotonic()
            state = _survey.find(namespace, lock_timeout=0.05)
            assert time.monotonic() - started >= 0.05
            assert state is not None and state.state == "live"
            assert state.workers is None and state.changes is None
            assert state.error is not None and "held by another process" in state.error
            assert state.capacity == 4  # the header is read without the lock
        finally:
            os.close(fd)
        state = _survey.find(namespace)
        assert state is not None and state.workers is not None and len(state.workers) == 1


def test_the_survey_waits_for_locked_registries_once_in_all(runtime_dir: Path) -> None:
    # Two registries locked by others: the first takes the whole budget, the second gets one
    # try, so that N locked namespaces cost lock_timeout, not N times it.
    names = ["first", "second"]
    with contextlib.ExitStack() as stack:
        fds = []
        for name in names:
            claim = stack.enter_context(owned(name))
            fd = os.open(claim.path / "registry", os.O_RDONLY)
            stack.callback(os.close, fd)
            fcntl.flock(fd, fcntl.LOCK_EX)
            fds.append(fd)
        found = _survey.survey(lock_timeout=0.05).namespaces
        errors = sorted(state.error or "" for state in found)
        assert len(found) == 2 and all(state.workers is None for state in found)
        assert sum("for more than" in error for error in errors) == 1, errors
        assert all("held by another process" in error for error in errors)


def test_a_reader_leaves_the_directory_mode_as_it_is(runtime_dir: Path, namespace: str) -> None:
    with owned(namespace):
        runtime_dir.chmod(0o750)
        try:
            assert _survey.find(namespace) is not None
            assert [state.name for state in _survey.survey().namespaces] == [namespace]
            assert runtime_dir.stat().st_mode & 0o777 == 0o750
        finally:
            runtime_dir.chmod(0o700)


def test_a_colliding_key_is_not_the_namespace(monkeypatch: pytest.MonkeyPatch,
                                              runtime_dir: Path) -> None:
    first, second = colliding_names(monkeypatch)
    entry = dead_owner(first)
    assert _survey.find(second) is None
    assert _survey.reclaim(namespace=second) == []
    assert os.listdir(runtime_dir) == [entry]
    state = _survey.find(first)
    assert state is not None and state.name == first
    assert [s.entry for s in _survey.reclaim(namespace=first)] == [entry]


def test_a_missing_runtime_directory_is_empty_and_never_created(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "missing"
    monkeypatch.setenv("ANYWOOL_RUNTIME_DIR", str(missing))
    assert _survey.survey() == _survey.Survey(missing, False, (), ())
    assert _survey.find("jobs") is None
    assert _survey.reclaim() == [] and _survey.reclaim(namespace="jobs") == []
    assert not missing.exists()


def test_names_no_entry_can_have_are_not_found(runtime_dir: Path) -> None:
    for name in ["ns-a\0b", "ns-../x", "tmp-", "jobs"]:
        assert _survey.find(name) is None
        assert _survey.reclaim(namespace=name) == []
