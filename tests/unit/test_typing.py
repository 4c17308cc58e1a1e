"""Static typing of the public API, checked with pyright."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# One Python answers for all, so CI runs these under 3.11 only: pyproject.toml pins pyright's
# pythonVersion to 3.11 whatever runs it (--pythonpath only finds the installed packages, the
# same versions in every venv), and the user's module mypy checks uses anywool's API, not
# anything of the standard library that differs between 3.11 and 3.13.
pytestmark = pytest.mark.once_per_ci


def _pyright(*paths: str) -> list[dict]:
    result = subprocess.run(
        # The packages of the venv running the suite (CI's .venv-3.11, say), not of the one
        # pyproject names for editors; the Python version is pyproject's pythonVersion.
        [sys.executable, "-m", "pyright", "--outputjson", "--pythonpath", sys.executable, *paths],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    report = json.loads(result.stdout)
    return [d for d in report["generalDiagnostics"] if d["severity"] == "error"]


def test_the_package_type_checks_cleanly():
    assert _pyright("src") == []


def test_subscriber_construction_is_typed_as_the_protocol_and_checks_arguments():
    errors = _pyright("tests/typing/subscriber_types.py")
    # The only error is the unknown keyword; assert_type on the protocol passed.
    assert [(e["range"]["start"]["line"] + 1, "capacity" in e["message"]) for e in errors] == [
        (9, True)
    ]


def test_resolved_is_typed_as_the_single_expected_type_or_keeps_the_dependencys():
    # assert_type fails type checking when the inferred type differs: no error means each
    # overload gave the documented type.
    assert _pyright("tests/typing/resolved_types.py") == []


def test_a_context_variable_is_typed_by_its_default_or_its_annotation():
    assert _pyright("tests/typing/context_types.py") == []


def test_a_proxy_takes_its_discovery_positionally_or_as_discovery_exactly_once():
    errors = _pyright("tests/typing/proxy_types.py")
    # The three forms type-check; no discovery, both, and a str as discovery= do not.
    assert [e["range"]["start"]["line"] + 1 for e in errors] == [9, 10, 11]


def test_a_users_module_over_the_whole_public_api_is_clean_under_pyright_strict() -> None:
    # tests/typing/user_api.py opts into strict mode itself (its first line).
    assert _pyright("tests/typing/user_api.py") == []


def test_a_users_module_over_the_whole_public_api_is_clean_under_mypy_strict() -> None:
    # anywool's own modules are read for their types but not reported on (silent): the check
    # is of what a user's code sees. The cache is off, so nothing is written in the checkout.
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
         "--python-executable", sys.executable, "--cache-dir", os.devnull,
         "tests/typing/user_api.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert (result.returncode, result.stdout.splitlines()[-1:]) == \
        (0, ["Success: no issues found in 1 source file"]), result.stdout + result.stderr
