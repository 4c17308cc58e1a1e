"""``anywool demo``, what ``make demo`` runs: every file hashed on the pool, checked here."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import psutil
import pytest

from ..helpers import wait_until

pytestmark = pytest.mark.anyio


async def test_the_demo_hashes_every_file_on_its_workers_and_checks_each(
        tmp_path: Path, anyio_backend: str) -> None:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    sizes = [0, 1, 1000, 70_000, 3_000_000]  # empty, tiny, and one past the 1 MiB read chunk
    for index, size in enumerate(sizes * 4):
        where = tree / "sub" if index % 2 else tree
        (where / f"f{index}").write_bytes(hashlib.sha256(str(index).encode()).digest()
                                          * (size // 32 + 1))
    (tree / "link").symlink_to(tree / "f0")  # not followed: not a regular file of its own
    with anyio.fail_after(120):
        done = await anyio.run_process(
            [sys.executable, "-m", "anywool.cli", "demo", str(tree), "--workers", "2",
             "--backend", anyio_backend], check=False, stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "200"})
    out = done.stdout.decode()
    assert done.returncode == 0, out
    assert f"hashing the files under {tree} on 2 workers ({anyio_backend})" in out
    assert f"verified {len(sizes) * 4} digests against a local computation; 0 mismatched" in out
    rows = re.findall(r"│\s+(\d+) │\s+([\d,]+) │\s+([\d,]+) │", out)
    pids = {pid for pid, _, _ in rows}
    assert len(pids) == 2, out  # both workers served calls
    assert sum(int(calls.replace(",", "")) for _, calls, _ in rows) == len(sizes) * 4


#: What the demo promises of Ctrl-C: it stops within this many seconds, whatever the tree.
CTRL_C_BOUND = 2.0


async def test_ctrl_c_stops_the_demo_promptly_and_leaves_no_worker(
        tmp_path: Path, anyio_backend: str) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    for index in range(20):
        (tree / f"small{index}").write_bytes(b"x" * index)
    # A sparse file of 1 TiB: its zeros read at memory speed, hashing it takes minutes.
    with open(tree / "huge", "wb") as huge:
        huge.truncate(1 << 40)
    with anyio.fail_after(60):
        process = await anyio.open_process(
            [sys.executable, "-m", "anywool.cli", "demo", str(tree), "--workers", "2",
             "--backend", anyio_backend], stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "COLUMNS": "200"})
        try:
            demo = psutil.Process(process.pid)

            def hashing() -> bool:  # a worker has read 1 GB of the huge file
                for child in demo.children(recursive=True):
                    try:
                        if child.io_counters().read_chars > 1 << 30:
                            return True
                    except psutil.NoSuchProcess:
                        pass
                return False

            await wait_until(hashing, "a worker to hash the huge file", timeout=30)
            workers = demo.children(recursive=True)
            pressed = anyio.current_time()
            os.killpg(process.pid, signal.SIGINT)
            with anyio.move_on_after(CTRL_C_BOUND + 10):
                await process.wait()
            took = anyio.current_time() - pressed
            assert process.stdout is not None
            chunks = []
            with anyio.move_on_after(5):
                async for chunk in process.stdout:
                    chunks.append(chunk)
            out = b"".join(chunks).decode(errors="replace")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with anyio.CancelScope(shield=True):
                await process.wait()
    assert took <= CTRL_C_BOUND, f"the demo took {took:.2f} s to stop:\n{out}"
    assert "Aborted!" in out, out
    _, alive = psutil.wait_procs(workers, timeout=5)
    assert alive == [], alive
