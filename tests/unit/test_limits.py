"""Documented limits and security checks, pinned on both sides of each edge (issue 21).

A limit is tested at its documented value (accepted) and one past it (refused with the
documented error); a security check once per case it covers (each permission bit of a secret
file, group and others of the runtime directory). ``scripts/mutations/security.py`` breaks each
of these promises and names the test here that must fail.
"""

from __future__ import annotations

import os
import secrets
import stat
import struct
from pathlib import Path

import anyio
import click
import pytest
from click.testing import CliRunner

from anywool import (
    DiscoveryBlockExhausted,
    DiscoveryCapacityExhausted,
    LocalDiscovery,
    WorkerPool,
    _runtime_dir,
    _secret,
)
from anywool.cli._worker_command import read_secret
from anywool.cli._worker_command import worker as worker_command
from anywool.discovery.local import _claim
from anywool.metadata import WorkerMetadata
from anywool.runtime.wire import _frames
from anywool.runtime.wire._frames import Frame, FrameError, FrameStream, Kind
from tests.helpers import worker

pytestmark = pytest.mark.anyio

MIB = 1024 * 1024
#: README: "frames of at most 64 MiB" (a frame's body: kind, call id and payload).
FRAME_LIMIT = 64 * MIB


# -- frames: at most 64 MiB ---------------------------------------------------------------------


class _Chunks(anyio.abc.ByteReceiveStream):
    """A receive stream over fixed chunks that counts the bytes it delivered."""

    def __init__(self, *chunks: bytes | bytearray) -> None:
        self._chunks = list(chunks)
        self.delivered = 0

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self._chunks:
            raise anyio.EndOfStream
        chunk = self._chunks.pop(0)
        self.delivered += len(chunk)
        return bytes(chunk)

    async def aclose(self) -> None:
        self._chunks.clear()


class _Sink(anyio.abc.ByteSendStream):
    """A send stream that keeps what it is sent, uncopied (64 MiB copies cost time)."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def send(self, item: bytes) -> None:
        self.sent.append(item)

    async def aclose(self) -> None:
        pass


async def test_a_frame_of_exactly_64_mib_crosses() -> None:
    payload = bytes(FRAME_LIMIT - _frames.ENVELOPE_OVERHEAD)  # a body of exactly 64 MiB
    sink = _Sink()
    with anyio.fail_after(30):
        await FrameStream(sink, _Chunks()).send(Frame(Kind.RESULT, 7, payload))
        (sent,) = sink.sent
        assert (struct.unpack_from(">I", sent)[0], len(sent)) == (FRAME_LIMIT, 4 + FRAME_LIMIT)
        del sink
        frame = await FrameStream(_Sink(), _Chunks(sent)).receive()
    assert (frame.kind, frame.call_id, len(frame.payload)) == (Kind.RESULT, 7, len(payload))
    assert _frames.payload_limit() == len(payload)  # what PayloadTooLarge is judged against


async def test_a_frame_one_byte_over_64_mib_is_neither_sent_nor_read() -> None:
    sink = _Sink()
    with anyio.fail_after(30):
        with pytest.raises(FrameError, match=f"exceeds the maximum of {FRAME_LIMIT} bytes"):
            await FrameStream(sink, _Chunks()).send(
                Frame(Kind.RESULT, 7, bytes(FRAME_LIMIT - _frames.ENVELOPE_OVERHEAD + 1)))
        assert sink.sent == []
        header = struct.pack(">I", FRAME_LIMIT + 1)
        source = _Chunks(header, bytes(_frames.ENVELOPE_OVERHEAD))
        with pytest.raises(FrameError, match=f"exceeds the maximum of {FRAME_LIMIT} bytes"):
            await FrameStream(_Sink(), source).receive()
    assert source.delivered == len(header)  # refused before any of its body was read


# -- spawn: at most 1024 ------------------------------------------------------------------------


def test_spawn_of_1024_is_accepted_and_1025_refused() -> None:
    WorkerPool(spawn=1024)  # constructed, never entered: nothing is started
    with pytest.raises(ValueError, match="^spawn must be between 1 and 1024, got 1025$"):
        WorkerPool(spawn=1025)


def test_the_worker_command_takes_1024_workers_and_refuses_1025(namespace: str) -> None:
    # --workers 1024 parses; the command then stops at an unrelated usage error before it
    # starts anything (--interface is for LAN discovery).
    common = ["--discovery", "local", "--namespace", namespace, "--interface", "127.0.0.1"]
    accepted = CliRunner().invoke(worker_command, [*common, "--workers", "1024"])
    assert accepted.exit_code == 2
    assert "--interface applies to --discovery lan only" in accepted.output
    refused = CliRunner().invoke(worker_command, [*common, "--workers", "1025"])
    assert refused.exit_code == 2
    assert "1025 is not in the range 1<=x<=1024" in refused.output


# -- the shared secret: at least 16 bytes ---------------------------------------------------------


def test_a_secret_of_16_bytes_is_accepted() -> None:
    assert _secret.resolve(b"\x00" * 16) == b"\x00" * 16
    assert _secret.resolve("é" * 8) == "é".encode() * 8  # 16 bytes in UTF-8, 8 characters


def test_a_secret_of_15_bytes_is_refused_naming_the_parameter() -> None:
    with pytest.raises(ValueError, match="^secret must be at least 16 bytes long, got 15 bytes"):
        _secret.resolve(b"s" * 15)
    with pytest.raises(ValueError, match="^worker_secret must be at least 16 bytes long, got 15"):
        _secret.resolve("s" * 15, "worker_secret")


def test_a_short_secret_in_the_environment_is_refused_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_secret, "_inherited", None)
    monkeypatch.setenv(_secret.ENV, "e" * 15)
    with pytest.raises(ValueError, match=r"^\$ANYWOOL_SECRET must be at least 16 bytes long"):
        _secret.resolve(None)
    monkeypatch.setenv(_secret.ENV, "e" * 16)
    assert _secret.resolve(None) == b"e" * 16


# -- the secret file: only its owner may access it ------------------------------------------------


def _secret_file(tmp_path: Path, mode: int, text: str = "s" * 32) -> Path:
    path = tmp_path / "secret"
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("bit", [stat.S_IRGRP, stat.S_IWGRP, stat.S_IXGRP,
                                 stat.S_IROTH, stat.S_IWOTH, stat.S_IXOTH],
                         ids=["group-read", "group-write", "group-exec",
                              "other-read", "other-write", "other-exec"])
def test_a_secret_file_any_group_or_other_permission_refuses(tmp_path: Path, bit: int) -> None:
    path = _secret_file(tmp_path, 0o600 | bit)
    with pytest.raises(click.BadParameter, match="accessible to other users") as info:
        read_secret(path)
    assert f"mode {0o600 | bit:04o}" in info.value.message
    assert "s" * 16 not in info.value.message  # the secret itself is never shown


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o700, 0o200])
def test_a_secret_file_only_its_owner_may_access_is_accepted(tmp_path: Path, mode: int) -> None:
    assert read_secret(_secret_file(tmp_path, mode)) == b"s" * 32


def test_a_secret_file_sheds_surrounding_whitespace(tmp_path: Path) -> None:
    secret = secrets.token_hex(8)  # 16 bytes: the whitespace around it must not count
    assert read_secret(_secret_file(tmp_path, 0o600, f" \t{secret}\n\n")) == secret.encode()


def test_a_secret_file_of_15_bytes_is_refused(tmp_path: Path) -> None:
    with pytest.raises(click.BadParameter, match="at least 16 bytes long, got 15 bytes"):
        read_secret(_secret_file(tmp_path, 0o600, "s" * 15 + "\n"))


# -- the runtime directory: 0700, never writable by others --------------------------------------


@pytest.mark.parametrize("mode", [0o720, 0o702, 0o770, 0o707])
def test_a_runtime_dir_writable_by_group_or_others_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    monkeypatch.setenv(_runtime_dir.ENV_VAR, str(shared))
    with pytest.raises(PermissionError, match=f"writable by others \\(mode {mode:o}\\)"):
        _claim.claim("jobs", capacity=1, block_size=64)
    assert os.listdir(shared) == []


def test_a_claim_narrows_a_readable_runtime_dir_to_0700(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    readable = tmp_path / "readable"
    readable.mkdir()
    readable.chmod(0o755)  # readable by all, writable by none but its owner: accepted
    monkeypatch.setenv(_runtime_dir.ENV_VAR, str(readable))
    _claim.claim("jobs", capacity=1, block_size=64).release()
    assert stat.S_IMODE(readable.stat().st_mode) == 0o700


# -- the local registry: 128 workers of at most 1024 bytes by default ---------------------------


async def test_a_default_registry_holds_128_workers_and_refuses_the_129th(namespace: str) -> None:
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace) as discovery, discovery.publisher as publisher:
            for _ in range(128):
                await publisher.publish("worker-added", worker())
            with pytest.raises(DiscoveryCapacityExhausted) as info:
                await publisher.publish("worker-added", worker())
    assert info.value.capacity == 128


def _metadata_of(size: int) -> WorkerMetadata:
    """Worker metadata whose encoding is exactly ``size`` bytes."""
    padded = worker(extra={"pad": ""})
    while len(padded.to_bytes()) < size:
        padded = worker(uid=padded.uid, extra={"pad": padded.extra["pad"] + "x"})
    # msgpack's str header grows past 31 and 255 characters: never overshoot silently.
    assert len(padded.to_bytes()) == size
    return padded


async def test_a_default_registry_takes_metadata_of_1024_bytes_and_refuses_1025(
        namespace: str) -> None:
    fits, too_big = _metadata_of(1024), _metadata_of(1025)
    with anyio.fail_after(30):
        async with LocalDiscovery(namespace) as discovery, discovery.publisher as publisher:
            await publisher.publish("worker-added", fits)
            with pytest.raises(DiscoveryBlockExhausted) as info:
                await publisher.publish("worker-added", too_big)
    assert info.value.size == 1025


def test_registry_capacity_and_block_size_take_their_documented_ranges() -> None:
    # LocalDiscovery: capacity 1 to 65 536, block_size 1 to 512 KiB (construction checks them).
    assert LocalDiscovery("jobs", capacity=65_536).capacity == 65_536
    with pytest.raises(ValueError, match="capacity must be between 1 and 65536, got 65537"):
        LocalDiscovery("jobs", capacity=65_537)
    assert LocalDiscovery("jobs", capacity=1, block_size=512 << 10).block_size == 512 << 10
    with pytest.raises(ValueError, match=f"block_size must be between 1 and {512 << 10}, got "
                                         f"{(512 << 10) + 1}"):
        LocalDiscovery("jobs", capacity=1, block_size=(512 << 10) + 1)


# -- durations: at most a week; repeated work at most every 0.01 s ------------------------------


def test_a_week_is_the_longest_duration_accepted() -> None:
    week = 7 * 24 * 3600
    LocalDiscovery("jobs", lock_timeout=week, poll_interval=week, reap_interval=week)
    with pytest.raises(ValueError, match=f"^lock_timeout must be >= 0 and at most {week} "):
        LocalDiscovery("jobs", lock_timeout=week + 0.001)


def test_an_interval_of_0_01_seconds_is_accepted_and_less_refused() -> None:
    assert LocalDiscovery.Subscriber("jobs", poll_interval=0.01).poll_interval == 0.01
    LocalDiscovery("jobs", poll_interval=0.01, reap_interval=0.01)
    for name in ("poll_interval", "reap_interval"):
        with pytest.raises(ValueError, match=f"^{name} must be at least 0.01 seconds"):
            LocalDiscovery("jobs", **{name: 0.0099})
