"""``anywool demo``, what ``make demo`` runs: every file hashed on the pool, checked here."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

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
    assert f"hashing {len(sizes) * 4} files" in out
    assert f"verified {len(sizes) * 4} digests against a local computation; 0 mismatched" in out
    rows = re.findall(r"│\s+(\d+) │\s+([\d,]+) │\s+([\d,]+) │", out)
    pids = {pid for pid, _, _ in rows}
    assert len(pids) == 2, out  # both workers served calls
    assert sum(int(calls.replace(",", "")) for _, calls, _ in rows) == len(sizes) * 4
