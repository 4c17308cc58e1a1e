"""Break the code on purpose, one promise at a time, and check that a test fails.

Each mutation replaces one exact piece of a source file (it must occur exactly once) and runs
the tests named for it; a mutation whose tests all pass *survived*: the promise it breaks is not
pinned. The file is restored after each run, whatever happens (Ctrl-C included).

Mutations are listed in ``scripts/mutations/*.py``, each module holding ``MUTATIONS``, a list of
:class:`Mutation` (``from mutate import Mutation``). Usage::

    python scripts/mutate.py                 # every mutation, each with its own tests
    python scripts/mutate.py --only NAME ... # the named ones
    python scripts/mutate.py --full          # the whole suite against each (slow)
    python scripts/mutate.py --list

Exit status: 0 when every mutation selected was killed, 1 when one survived, 2 for a mutation
that no longer applies (its ``old`` text is gone or ambiguous).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Mutation:
    """One promise broken: ``old`` (exactly once in ``path``) becomes ``new``; ``tests`` are
    pytest node ids or paths expected to fail with it."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    why: str = ""


def load() -> list[Mutation]:
    found: list[Mutation] = []
    for module_path in sorted((ROOT / "scripts" / "mutations").glob("*.py")):
        if module_path.name.startswith("_"):
            continue
        spec = importlib.util.spec_from_file_location(f"mutations_{module_path.stem}", module_path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        found.extend(module.MUTATIONS)
    names = [m.name for m in found]
    duplicated = {n for n in names if names.count(n) > 1}
    if duplicated:
        raise SystemExit(f"mutation names used twice: {sorted(duplicated)}")
    return found


def run(mutation: Mutation, full: bool, pytest_args: list[str]) -> str:
    """``killed``, ``survived`` or ``stale`` (the mutation no longer applies)."""
    path = ROOT / mutation.path
    original = path.read_text()
    if original.count(mutation.old) != 1:
        return "stale"
    tests = [] if full else list(mutation.tests)
    command = [sys.executable, "-m", "pytest", "-q", "-x",
               *pytest_args, *tests]
    # This tree's sources, also in the worker processes the tests start (a git worktree shares
    # the virtual environment, whose editable install points at another tree).
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                        os.environ.get("PYTHONPATH")])))
    path.write_text(original.replace(mutation.old, mutation.new))
    try:
        result = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    finally:
        path.write_text(original)
    # pytest: 1 = tests failed; 0 = all passed; anything else (usage, collection) is not a kill.
    if result.returncode == 1:
        return "killed"
    if result.returncode == 0:
        return "survived"
    return f"error (pytest exit {result.returncode})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these mutations only")
    parser.add_argument("--full", action="store_true", help="run the whole suite against each")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    mutations = load()
    if args.only:
        unknown = set(args.only) - {m.name for m in mutations}
        if unknown:
            parser.error(f"unknown mutations: {sorted(unknown)}")
        mutations = [m for m in mutations if m.name in args.only]
    if args.list:
        for m in mutations:
            print(f"{m.name:40} {m.path}  {m.why}")
        return 0
    outcome = 0
    for m in mutations:
        start = time.monotonic()
        verdict = run(m, args.full, args.pytest_args)
        print(f"{verdict:10} {m.name:40} {time.monotonic() - start:6.1f} s", flush=True)
        if verdict == "stale":
            outcome = max(outcome, 2)
        elif verdict != "killed":
            outcome = max(outcome, 1)
    return outcome


if __name__ == "__main__":
    sys.exit(main())
