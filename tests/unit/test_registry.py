"""The synchronous registry core on its own: keys, journal, failures, foreign state."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import math
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from anywool import DiscoveryNamespaceInUse, DiscoveryNamespaceNotFound, DiscoveryRegistryCorrupt
from anywool.discovery.local import _binding, _claim, _keys, _layout

from ..helpers import colliding_names, worker


@contextlib.contextmanager
def _owned_and_bound(namespace: str, *, capacity: int,
                     block_size: int) -> Iterator[tuple[_claim.Claim, _binding.Binding,
                                                        _binding.Lease]]:
    """An owner's claim, a borrower's binding and a publisher's lease on one namespace; all
    released afterwards."""
    claim = _claim.claim(namespace, capacity=capacity, block_size=block_size)
    try:
        binding = _binding.bind(namespace)
        try:
            lease = binding.open_lease()
            try:
                yield claim, binding, lease
            finally:
                lease.release()
        finally:
            binding.close()
    finally:
        claim.release()

def die(holder: _claim.Claim) -> None:
    """Close an owner's descriptors as its death would (the kernel drops its flock)."""
    holder.forget()


def test_keys_are_hashed_domain_separated_and_fixed_length():
    keys = {_keys.namespace_key(name) for name in ["a/b", "..", "x" * 10_000, "\0", "ü"]}
    assert len(keys) == 5
    assert all(len(key) == 26 and key.isalnum() for key in keys)
    # Domain separation: the key is not the plain hash the digest uses.
    assert _keys.namespace_key("jobs") not in _keys.namespace_digest("jobs").hex()


def test_key_collision_never_binds_the_other_namespace(monkeypatch):
    first, second = colliding_names(monkeypatch)
    claim = _claim.claim(first, capacity=2, block_size=256)
    try:
        with pytest.raises(DiscoveryNamespaceNotFound):
            _binding.bind(second)
        with pytest.raises(DiscoveryNamespaceInUse) as info:
            _claim.claim(second, capacity=2, block_size=256)
        assert info.value.namespace == second
        _binding.bind(first).close()
    finally:
        claim.release()


def test_journal_replays_changes_and_reports_a_gap():
    with _owned_and_bound("journal", capacity=4, block_size=256) as (claim, binding, lease):
        start, view = binding.snapshot()
        assert view == {}
        a, b = worker(), worker()
        binding.publish("worker-added", a, lease.id, lock_timeout=1)
        binding.publish("worker-added", b, lease.id, lock_timeout=1)
        binding.publish("worker-updated", worker(uid=a.uid, pid=3), lease.id, lock_timeout=1)
        binding.publish("worker-dropped", b, lease.id, lock_timeout=1)
        counter, changes = binding.changes_since(start)
        assert counter == start + 4
        assert [(c.kind, c.uid) for c in changes] == [
            ("worker-added", a.uid), ("worker-added", b.uid),
            ("worker-updated", a.uid), ("worker-dropped", b.uid),
        ]
        assert changes[2].metadata.pid == 3
        for _ in range(_layout.JOURNAL_LENGTH):
            binding.publish("worker-updated", worker(uid=a.uid, pid=4), lease.id, lock_timeout=1)
        assert binding.changes_since(start) is None  # overwritten: resynchronise instead
        _, view = binding.snapshot()
        assert list(view) == [a.uid] and view[a.uid].pid == 4


def test_failed_sizing_removes_everything_and_a_retry_succeeds(monkeypatch, runtime_dir: Path):
    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(os, "posix_fallocate", no_space)
        with pytest.raises(OSError) as info:
            _claim.claim("full", capacity=8, block_size=1024)
    assert info.value.errno == errno.ENOSPC
    assert os.listdir(runtime_dir) == []
    _claim.claim("full", capacity=8, block_size=1024).release()
    assert os.listdir(runtime_dir) == []


def test_runtime_dir_of_another_user_is_refused(monkeypatch):
    real_uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real_uid + 4242)
    with pytest.raises(PermissionError, match="owned by uid"):
        _claim.claim("theirs", capacity=1, block_size=64)


def test_runtime_dir_symlink_is_refused(tmp_path, monkeypatch):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setenv("ANYWOOL_RUNTIME_DIR", str(link))
    # (The test's own tmp_path holds "symlink" too: match the reason, not the word.)
    with pytest.raises(PermissionError, match=": it is a symlink$"):
        _claim.claim("jobs", capacity=1, block_size=64)
    assert os.listdir(real) == []


def test_forked_child_of_owner_removes_nothing(runtime_dir: Path):
    claim = _claim.claim("forked", capacity=1, block_size=64)
    try:
        pid = os.fork()
        if pid == 0:  # the child: releasing must leave the parent's namespace alone
            try:
                claim.release()
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert claim.path.exists()
        binding = _binding.bind("forked")  # still owned and live
        binding.close()
    finally:
        claim.release()
    assert os.listdir(runtime_dir) == []


def test_leftovers_of_killed_claimants_are_swept(runtime_dir: Path):
    stale_tmp = runtime_dir / f"tmp-{uuid.uuid4().hex[:16]}"
    stale_dead = runtime_dir / f"dead-{uuid.uuid4().hex[:16]}"
    for directory in (stale_tmp, stale_dead):
        directory.mkdir()
        (directory / "registry").write_bytes(b"x")
    os.utime(stale_tmp, (0, 0))  # old enough not to be a claimant in progress
    _claim.claim("sweeper", capacity=1, block_size=64).release()
    assert os.listdir(runtime_dir) == []


def test_reclaim_false_names_a_dead_owner(runtime_dir: Path):
    claim = _claim.claim("dead", capacity=1, block_size=64)
    die(claim)
    with pytest.raises(DiscoveryNamespaceInUse) as info:
        _claim.claim("dead", capacity=1, block_size=64, reclaim=False)
    assert info.value.owner_pid is None and "dead" in str(info.value)
    assert info.value.path == str(claim.path)
    successor = _claim.claim("dead", capacity=1, block_size=64)
    successor.release()
    assert os.listdir(runtime_dir) == []


def test_dead_generations_of_other_namespaces_are_swept(runtime_dir: Path, monkeypatch):
    # A SIGKILLed pool's random namespace is never claimed again: the next claim of any
    # namespace removes it once its owner's lock is free.
    abandoned = _claim.claim("abandoned", capacity=1, block_size=64)
    die(abandoned)
    live = _claim.claim("live", capacity=1, block_size=64)  # swept just before the death
    try:
        _claim.claim("other", capacity=1, block_size=64).release()
        # Within SWEEP_INTERVAL of the last sweep, a claim's fast path sweeps nothing else.
        assert sorted(os.listdir(runtime_dir)) == sorted([abandoned.path.name, live.path.name])
        monkeypatch.setattr(_claim, "_last_sweep", -math.inf)  # the interval has passed
        _claim.claim("other", capacity=1, block_size=64).release()
        assert os.listdir(runtime_dir) == [live.path.name]
    finally:
        live.release()


def test_a_change_whose_writer_died_mid_commit_is_rolled_forward(monkeypatch):
    with _owned_and_bound("torn", capacity=4, block_size=256) as (claim, binding, lease):
        a = worker()
        binding.publish("worker-added", a, lease.id, lock_timeout=1)
        after_add, _ = binding.snapshot()

        def die(*args, **kwargs):  # the writer dies after journalling, before the slot
            raise SystemExit("killed")

        with monkeypatch.context() as patch:
            patch.setattr(_layout.Table, "_apply", die)
            with pytest.raises(SystemExit):
                binding.publish("worker-dropped", a, lease.id, lock_timeout=1)
        assert binding.snapshot()[0] == after_add  # not yet visible
        assert claim.reap() == []  # the owner's next round rolls it forward
        counter, changes = binding.changes_since(after_add)
        assert [(c.kind, c.uid) for c in changes] == [("worker-dropped", a.uid)]
        assert binding.snapshot() == (counter, {})


def test_reaper_removes_lease_files_of_dead_publishers_without_workers():
    claim = _claim.claim("leases", capacity=4, block_size=256)
    binding = _binding.bind("leases")
    try:
        dead = binding.open_lease()
        dead.forget()  # its publisher died holding no worker
        live = binding.open_lease()
        claim.reap()
        names = sorted(os.listdir(claim.path))
        assert names == sorted(["name", "notify", "owner", "registry", live.path.name])
        live.release()
    finally:
        binding.close()
        claim.release()


def test_runtime_dir_writable_by_others_is_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("ANYWOOL_RUNTIME_DIR", str(shared))
    with pytest.raises(PermissionError, match="writable by others"):
        _claim.claim("jobs", capacity=1, block_size=64)


def test_borrowers_never_create_the_runtime_dir(tmp_path, monkeypatch):
    missing = tmp_path / "missing"
    monkeypatch.setenv("ANYWOOL_RUNTIME_DIR", str(missing))
    with pytest.raises(DiscoveryNamespaceNotFound):
        _binding.bind("jobs")
    assert not missing.exists()


def _damage(path: Path, damage: str) -> None:
    if damage == "truncate":
        os.truncate(path, 200)
    elif damage == "huge-capacity":
        with open(path, "r+b") as file:  # capacity is the u32 after magic and version
            file.seek(12)
            file.write((2**31).to_bytes(4, "little"))
    else:  # the change counter at its maximum (it sits after the header's fixed fields)
        with open(path, "r+b") as file:
            file.seek(_layout.COUNTER_OFFSET)
            file.write((2**64 - 1).to_bytes(8, "little"))


@pytest.mark.parametrize("damage", ["truncate", "huge-capacity"])
def test_a_corrupt_registry_of_a_live_owner_is_reported_as_such(damage, runtime_dir: Path):
    claim = _claim.claim("corrupt", capacity=4, block_size=256)
    try:
        _damage(claim.path / "registry", damage)
        with pytest.raises(DiscoveryRegistryCorrupt) as info:
            _binding.bind("corrupt")
        assert info.value.namespace == "corrupt"
        assert info.value.path == str(claim.path / "registry")
    finally:
        claim.release()
    assert os.listdir(runtime_dir) == []  # the owner's exit removes it all the same


def test_running_out_of_descriptors_is_not_reported_as_a_corrupt_registry(
        runtime_dir: Path, monkeypatch: pytest.MonkeyPatch):
    claim = _claim.claim("busy", capacity=4, block_size=256)
    try:
        real_open = _binding.open_file

        def exhausted(name: str, *args, **kwargs):
            if name == "registry":
                raise OSError(errno.EMFILE, "Too many open files")
            return real_open(name, *args, **kwargs)

        monkeypatch.setattr(_binding, "open_file", exhausted)
        with pytest.raises(OSError) as info:
            _binding.bind("busy")
        assert info.value.errno == errno.EMFILE
        assert not isinstance(info.value, DiscoveryRegistryCorrupt)
    finally:
        claim.release()


@pytest.mark.parametrize("damage", ["truncate", "counter-exhausted"])
def test_a_registry_damaged_under_a_binding_raises_typed_errors(damage, runtime_dir: Path):
    with _owned_and_bound("damaged", capacity=4, block_size=256) as (claim, binding, lease):
        _damage(claim.path / "registry", damage)
        with pytest.raises(DiscoveryRegistryCorrupt, match="live owner"):
            binding.publish("worker-added", worker(), lease.id, lock_timeout=1)
        if damage == "truncate":
            with pytest.raises(DiscoveryRegistryCorrupt):
                binding.snapshot(lock_timeout=1)


@pytest.mark.parametrize("offset, data", [(0, b"\xa5" * _layout.HEADER.size),  # garbage
                                          (8, (99).to_bytes(4, "little")),  # another format
                                          (_layout.COUNTER_OFFSET + 8, b"\x07")],  # retired=7
                         ids=["garbage", "other-format", "retired-flag"])
def test_a_header_damaged_under_a_binding_is_never_written_over(offset, data, runtime_dir: Path):
    with _owned_and_bound("overwritten", capacity=4, block_size=256) as (claim, binding, lease):
        registry = claim.path / "registry"
        with open(registry, "r+b") as file:
            file.seek(offset)
            file.write(data)
        damaged = registry.read_bytes()
        with pytest.raises(DiscoveryRegistryCorrupt):
            binding.counter()
        with pytest.raises(DiscoveryRegistryCorrupt):
            binding.publish("worker-added", worker(), lease.id, lock_timeout=1)
        with pytest.raises(DiscoveryRegistryCorrupt):
            binding.withdraw(lease.id, lock_timeout=1)
        with pytest.raises(DiscoveryRegistryCorrupt):
            claim.reap(lock_timeout=1)
        assert registry.read_bytes() == damaged


def test_a_successor_in_the_place_of_a_retiring_owner_is_not_taken_for_damage(
        runtime_dir: Path):
    # An exiting owner retires, renames its generation away (a successor may claim at once),
    # and only then lets its lock go: a borrower looking in between finds another registry
    # under a live owner, and must read that as the generation over, not as damage.
    with _owned_and_bound("turnover", capacity=4, block_size=256) as (claim, binding, lease):
        assert binding.reachable()
        claim.retire()
        away = runtime_dir / "dead-retiring"
        os.rename(claim.path, away)
        successor = _claim.claim("turnover", capacity=4, block_size=256)
        try:
            assert binding.reachable() is False
        finally:
            successor.release()
            os.rename(away, claim.path)  # for the owner's own exit to remove


def test_a_corrupt_registry_of_a_dead_owner_reads_as_not_found(runtime_dir: Path):
    claim = _claim.claim("dead-corrupt", capacity=4, block_size=256)
    path = claim.path
    _damage(path / "registry", "truncate")
    claim.close()  # the owner "dies": its lock goes, its files stay
    with pytest.raises(DiscoveryNamespaceNotFound):
        _binding.bind("dead-corrupt")
    _claim.claim("dead-corrupt", capacity=4, block_size=256).release()  # and is reclaimable


@pytest.mark.parametrize("obstacle", ["symlink", "file"])
def test_something_else_at_a_namespace_path_is_replaced_by_a_claim(obstacle, runtime_dir: Path):
    target = _keys.namespace_path("blocked")
    if obstacle == "symlink":
        target.symlink_to(runtime_dir)
    else:
        target.write_bytes(b"junk")
    with pytest.raises(DiscoveryNamespaceNotFound):
        _binding.bind("blocked")
    claim = _claim.claim("blocked", capacity=1, block_size=64)
    assert claim.path.is_dir() and not claim.path.is_symlink()
    claim.release()
    assert os.listdir(runtime_dir) == []


FORK_SCENARIO = """
import os
from anywool.discovery.local import _binding, _claim, _keys, _layout
claim = _claim.claim("fork-lock", capacity=1, block_size=64)
read_end, write_end = os.pipe()
forked_r, forked_w = os.pipe()
pid = os.fork()
if pid == 0:  # a long-lived child, e.g. a multiprocessing worker started with fork
    os.close(write_end)
    os.write(forked_w, b"!")  # fork returned here: the at-fork handlers have run
    os.read(read_end, 1)
    os._exit(0)
os.close(read_end)
os.read(forked_r, 1)  # else the successor may look before the child dropped its copies
claim.forget()  # the owner's descriptors close, as at its death, while the child lives
successor = _claim.claim("fork-lock", capacity=1, block_size=64)
successor.release()
os.close(write_end)
os.waitpid(pid, 0)
print("successor admitted")
"""


def test_a_forked_child_does_not_keep_a_dead_owner_alive(runtime_dir: Path):
    # In a fresh interpreter: here, any thread spawning a process would briefly share the
    # simulated-dead owner's lock between its fork and exec, which no dead process can do.
    result = subprocess.run([sys.executable, "-c", FORK_SCENARIO], capture_output=True,
                            text=True, timeout=60)
    assert result.stdout.strip() == "successor admitted", result.stderr
    assert os.listdir(runtime_dir) == []


# -- bounded teardown --------------------------------------------------------------------------


class Interrupted(BaseException):
    """Stands in for the cancellation a checkpoint raises in a worker thread."""


def _hold_registry_lock(claim: _claim.Claim) -> int:
    """Lock the registry through a descriptor of our own, as another process would."""
    fd = os.open(claim.path / "registry", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_retire_that_times_out_writes_nothing_and_release_still_removes(runtime_dir: Path):
    claim = _claim.claim("wedged", capacity=1, block_size=64)
    binding = _binding.bind("wedged")
    holder = _hold_registry_lock(claim)
    try:
        with pytest.raises(TimeoutError, match="wedged"):
            claim.retire(lock_timeout=0.05)
        assert binding.is_live()  # not retired: the graceful part wrote nothing
        claim.release(lock_timeout=0)  # one try, then retire without the lock and remove
        assert binding.counter()[1]  # retired, as a borrower still holding the file sees it
        assert not binding.is_live()
        assert os.listdir(runtime_dir) == []
        claim.release(lock_timeout=0)  # idempotent
    finally:
        os.close(holder)
        binding.close()


def test_release_whose_lock_wait_is_interrupted_still_retires_removes_and_reraises(
        runtime_dir: Path):
    claim = _claim.claim("interrupted", capacity=1, block_size=64)
    binding = _binding.bind("interrupted")
    holder = _hold_registry_lock(claim)
    calls = 0

    def checkpoint() -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise Interrupted

    try:
        with pytest.raises(Interrupted):
            claim.release(lock_timeout=None, checkpoint=checkpoint)
        assert calls == 3
        assert binding.counter()[1]
        assert os.listdir(runtime_dir) == []
        claim.release()  # idempotent: nothing left to do, nothing raised
    finally:
        os.close(holder)
        binding.close()


def test_retired_claim_releases_without_taking_the_lock_again(runtime_dir: Path):
    claim = _claim.claim("retired", capacity=1, block_size=64)
    binding = _binding.bind("retired")
    try:
        claim.retire(lock_timeout=1)
        assert not binding.is_live()
        holder = _hold_registry_lock(claim)  # the lock is free again after retiring
        try:
            claim.release(lock_timeout=None)  # would wait forever if it took the lock again
        finally:
            os.close(holder)
        assert os.listdir(runtime_dir) == []
    finally:
        binding.close()


def test_withdraw_lock_wait_is_interruptible_and_changes_nothing():
    with _owned_and_bound("withdraw", capacity=2, block_size=256) as (claim, binding, lease):
        metadata = worker()
        binding.publish("worker-added", metadata, lease.id, lock_timeout=1)
        holder = _hold_registry_lock(claim)
        try:
            def checkpoint() -> None:
                raise Interrupted

            with pytest.raises(Interrupted):
                binding.withdraw(lease.id, lock_timeout=None, checkpoint=checkpoint)
            with pytest.raises(TimeoutError):
                binding.withdraw(lease.id, lock_timeout=0)
        finally:
            os.close(holder)
        assert list(binding.snapshot()[1]) == [metadata.uid]
        assert binding.withdraw(lease.id, lock_timeout=0) == 1
        assert binding.snapshot()[1] == {}


def test_a_refresh_whose_writer_died_between_block_and_slot_reads_as_rolled_forward(monkeypatch):
    with _owned_and_bound("torn-refresh", capacity=4, block_size=256) as (claim, binding, lease):
        a = worker(extra={"size": "small"})
        binding.publish("worker-added", a, lease.id, lock_timeout=1)
        counter, _ = binding.snapshot()
        refreshed = worker(uid=a.uid, extra={"size": "a good deal larger than before" * 3})
        real_pwrite = os.pwrite
        writes: list[int] = []

        def die_after_the_block(fd, data, offset):  # the writer dies between block and slot
            if offset >= binding.table.blocks_offset:
                real_pwrite(fd, data, offset)
                writes.append(offset)
                raise SystemExit("killed")
            return real_pwrite(fd, data, offset)

        with monkeypatch.context() as patch:
            patch.setattr(os, "pwrite", die_after_the_block)
            with pytest.raises(SystemExit):
                binding.publish("worker-added", refreshed, lease.id, lock_timeout=1)
        assert writes  # the block was written, the slot was not
        fresh = _binding.bind("torn-refresh")
        try:
            seen_counter, view = fresh.snapshot()
            assert seen_counter == counter
            assert list(view) == [a.uid] and view[a.uid].same_as(refreshed)
            assert fresh.unreadable_blocks == 0
        finally:
            fresh.close()
        assert claim.reap() == []  # the owner rolls it forward
        assert binding.snapshot() == (counter + 1, {a.uid: refreshed})


def test_a_corrupt_block_is_counted_logged_once_and_never_yielded(caplog):
    with _owned_and_bound("corrupt-block", capacity=4, block_size=256) as (claim, binding, lease):
        good, bad = worker(), worker()
        binding.publish("worker-added", good, lease.id, lock_timeout=1)
        binding.publish("worker-added", bad, lease.id, lock_timeout=1)
        table = binding.table
        os.pwrite(binding.registry_fd, b"\xc1" * 16, table.blocks_offset + 1 * table.block_size)
        for _ in range(3):
            _, view = binding.snapshot()
            assert list(view) == [good.uid]
        assert binding.unreadable_blocks == 3
        assert caplog.text.count("could not be decoded") == 1


def test_a_block_of_well_formed_msgpack_with_fields_of_the_wrong_kind_is_unreadable():
    import msgpack

    with _owned_and_bound("wrong-kind", capacity=4, block_size=256) as (claim, binding, lease):
        binding.publish("worker-added", good := worker(), lease.id, lock_timeout=1)
        binding.publish("worker-added", worker(), lease.id, lock_timeout=1)
        forged = msgpack.packb([1, 5, "127.0.0.1:1", 1, "1", [], {}, False])
        table = binding.table
        os.pwrite(binding.registry_fd, forged, table.blocks_offset + table.block_size)
        os.pwrite(binding.registry_fd, len(forged).to_bytes(4, "little"),
                  _layout.HEADER_SPACE + _layout.SLOT.size + 40)  # the slot's payload length
        _, view = binding.snapshot()
        assert list(view) == [good.uid] and binding.unreadable_blocks == 1


def test_try_claim_gives_way_to_any_generation_and_leaves_nothing(runtime_dir: Path):
    claim = _claim.claim("taken", capacity=1, block_size=64)
    try:
        assert _claim.try_claim("taken", capacity=1, block_size=64) is None
        assert os.listdir(runtime_dir) == [claim.path.name]
        die(claim)  # a dead owner's generation: try_claim does not judge, claim does
        assert _claim.try_claim("taken", capacity=1, block_size=64) is None
        assert os.listdir(runtime_dir) == [claim.path.name]
        _claim.claim("taken", capacity=1, block_size=64).release()
    finally:
        claim.release()
    assert os.listdir(runtime_dir) == []
    fresh = _claim.try_claim("free", capacity=1, block_size=64)
    assert fresh is not None and fresh.try_release()
    assert os.listdir(runtime_dir) == []


def test_try_release_does_nothing_while_a_writer_holds_the_lock(runtime_dir: Path):
    with _owned_and_bound("held", capacity=2, block_size=256) as (claim, binding, lease):
        fcntl.flock(binding.registry_fd, fcntl.LOCK_EX)
        assert claim.try_release() is False
        assert binding.is_live() and not claim.released
        fcntl.flock(binding.registry_fd, fcntl.LOCK_UN)
        assert claim.try_release() is True
        assert not binding.is_live() and claim.released
    assert os.listdir(runtime_dir) == []


def test_no_space_for_a_block_fails_the_publish_before_anything_is_written(monkeypatch):
    # A claim reserves the header and slots only; each change reserves its journal entry and
    # block before writing either, so running out of space leaves the registry as it was.
    with _owned_and_bound("space", capacity=4, block_size=256) as (claim, binding, lease):
        binding.publish("worker-added", a := worker(), lease.id, lock_timeout=1)
        before = os.pread(binding.registry_fd, binding.table.size, 0)

        def no_space(fd: int, offset: int, length: int) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        with monkeypatch.context() as patch:
            patch.setattr(os, "posix_fallocate", no_space)
            with pytest.raises(OSError) as info:
                binding.publish("worker-added", worker(), lease.id, lock_timeout=1)
        assert info.value.errno == errno.ENOSPC
        assert os.pread(binding.registry_fd, binding.table.size, 0) == before
        binding.publish("worker-updated", worker(uid=a.uid, pid=9), lease.id, lock_timeout=1)
        assert binding.snapshot()[1][a.uid].pid == 9


def test_a_fresh_registry_reserves_only_its_header_and_slots():
    claim = _claim.claim("sparse", capacity=128, block_size=1024)
    try:
        info = os.fstat(claim.registry_fd)
        assert info.st_size == _layout.registry_size(128, 1024)
        # Header, slots and journal headers only: payloads and blocks not yet.
        assert info.st_blocks * 512 < claim.table.payloads_offset + 8192
    finally:
        claim.release()


MOUNTS = "\n".join([
    "22 1 0:1 / / rw,relatime - ext4 /dev/vda rw",
    "25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw",
    "30 22 0:30 / /mnt/my\\040disk rw shared:1 - tmpfs none rw",
    "31 30 0:31 / /mnt/my\\040disk/in rw - xfs /dev/vdb rw",
    "32 22 0:32 / /mnt/over rw - ext4 /dev/vdc rw",
    "33 22 0:33 / /mnt/over rw - ramfs none rw",
])


@pytest.mark.parametrize(("path", "expected"), [
    ("/dev/shm/anywool-0", "tmpfs"),
    ("/dev/shmx", "ext4"),  # a prefix of the name is not a parent
    ("/mnt/my disk/a", "tmpfs"),  # escaped space in the mount point
    ("/mnt/my disk/in/b", "xfs"),  # the deepest mount wins
    ("/mnt/over/x", "ramfs"),  # mounted over: the last one is the visible one
    ("/", "ext4"),
])
def test_the_file_system_of_a_path_comes_from_the_mount_table(path, expected):
    from anywool._runtime_dir import filesystem_type

    assert filesystem_type(path, MOUNTS) == expected
    assert filesystem_type(path, "") is None


def test_in_memory_follows_the_runtime_directory(monkeypatch, tmp_path):
    from anywool import _runtime_dir

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    monkeypatch.setenv("ANYWOOL_RUNTIME_DIR", "/dev/shm/anywool-test-not-created")
    assert _runtime_dir.in_memory() is True
    monkeypatch.setenv("ANYWOOL_RUNTIME_DIR", "/proc/anywool")  # procfs: not a memory fs
    assert _runtime_dir.in_memory() is False
    monkeypatch.setenv("ANYWOOL_RUNTIME_DIR", "relative")
    with pytest.raises(ValueError, match="absolute"):
        _runtime_dir.in_memory()


def test_with_no_space_left_workers_can_still_be_dropped_withdrawn_and_reaped(monkeypatch):
    # A drop writes only what the claim reserved (header, slots, journal): a full file system
    # can stop new workers, never the removal of old ones.
    with _owned_and_bound("full", capacity=8, block_size=256) as (claim, binding, lease):
        workers = [worker() for _ in range(4)]
        for each in workers:
            binding.publish("worker-added", each, lease.id, lock_timeout=1)
        dead = binding.open_lease()
        binding.publish("worker-added", orphan := worker(), dead.id, lock_timeout=1)

        def no_space(fd: int, offset: int, length: int) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "posix_fallocate", no_space)
        with pytest.raises(OSError):
            binding.publish("worker-added", worker(), lease.id, lock_timeout=1)
        assert binding.publish("worker-dropped", workers[0], lease.id, lock_timeout=1)
        assert binding.withdraw(lease.id, lock_timeout=1) == 3
        dead.forget()  # its process died: the kernel dropped its lock, the file stays
        assert claim.reap(lock_timeout=1) == [orphan.uid]
        assert binding.snapshot()[1] == {}
