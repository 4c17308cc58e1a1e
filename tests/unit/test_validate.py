"""Argument checks shared by every public constructor: clear errors naming the parameter."""

from __future__ import annotations

import math

import pytest

from anywool import LocalDiscovery, WorkerPool, WorkerProxy, resolved


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 10**400, 7 * 24 * 3600 + 1, -1])
@pytest.mark.parametrize(
    "construct",
    [lambda v: WorkerPool(spawn=1, shutdown_timeout=v),
     lambda v: WorkerPool(spawn=1, announce_timeout=v),
     lambda v: WorkerPool(spawn=1, quorum_timeout=v),
     lambda v: WorkerProxy("ns", quorum_timeout=v),
     lambda v: LocalDiscovery("ns", lock_timeout=v),
     lambda v: LocalDiscovery.Subscriber("ns", poll_interval=v)],
    ids=["shutdown_timeout", "announce_timeout", "quorum_timeout", "proxy.quorum_timeout",
         "lock_timeout", "poll_interval"],
)
def test_durations_must_be_finite_and_at_most_a_week(construct, value, request) -> None:
    name = request.node.callspec.id.split("-")[0].removeprefix("proxy.")
    with pytest.raises(ValueError, match=f"^{name} must be"):
        construct(value)


def test_none_means_no_limit_only_where_documented() -> None:
    LocalDiscovery("ns", lock_timeout=None)
    with pytest.raises(TypeError, match="shutdown_timeout must be a number of seconds"):
        WorkerPool(spawn=1, shutdown_timeout=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("tags", "match"),
    [(None, "tags must be an iterable of str, got None"),
     ("gpu", "tags must be an iterable of str, not a str"),
     ([["a"]], r"tags must contain only str, got \['a'\]"),
     ([1], "tags must contain only str, got 1")],
)
def test_tags_name_the_parameter(tags: object, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        WorkerPool(spawn=1, tags=tags)  # type: ignore[arg-type]


def test_pool_uri_tags_name_the_parameter() -> None:
    with pytest.raises(TypeError, match="uri_tags must contain only str"):
        WorkerProxy("ns", ["a"])  # type: ignore[arg-type]


@pytest.mark.parametrize("expect", [42, (), (int, 42), "int"])
def test_resolved_checks_expect_at_once(expect: object) -> None:
    with pytest.raises(TypeError, match="expect must be a type or a non-empty tuple of types"):
        resolved(object(), expect=expect)  # type: ignore[call-overload]


def test_the_trio_backend_without_trio_names_the_extra_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from anywool import _validate
    from anywool.runtime.pool._local_worker import LocalWorker

    assert _validate._missing("anywool_has_no_such_module") and not _validate._missing("anyio")
    # As where trio is not installed (restored after the test).
    monkeypatch.delitem(sys.modules, "trio", raising=False)
    monkeypatch.setattr(_validate, "_missing", lambda module: module == "trio")
    for make in (lambda: WorkerPool(spawn=1, backend="trio"),
                 lambda: LocalWorker(backend="trio")):
        with pytest.raises(ImportError, match=r"backend='trio' needs trio.*anywool\[trio\]"):
            make()
    assert _validate.backend("asyncio") == "asyncio"  # asyncio needs nothing more


def test_lan_discovery_without_zeroconf_names_the_extra_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from anywool import _validate
    from anywool.discovery.lan import LanDiscovery

    # As where zeroconf is not installed (restored after the test): a plain install leaves it
    # out, and every way in says what to install, before anything is started.
    monkeypatch.delitem(sys.modules, "zeroconf", raising=False)
    monkeypatch.setattr(_validate, "_missing", lambda module: module == "zeroconf")
    for make in (lambda: LanDiscovery("jobs"), lambda: LanDiscovery.Publisher("jobs"),
                 lambda: LanDiscovery.Subscriber("jobs")):
        with pytest.raises(ImportError, match=r"^LanDiscovery needs zeroconf, which is not "
                           r"installed here: pip install 'anywool\[lan\]'$") as caught:
            make()
        assert caught.value.name == "zeroconf"


@pytest.mark.parametrize(("args", "module", "extra"), [
    (["--discovery", "lan"], "zeroconf", "lan"),
    (["--discovery", "local", "--backend", "trio"], "trio", "trio"),
])
def test_anywool_worker_without_an_extra_says_what_to_install(
        args: list[str], module: str, extra: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from click.testing import CliRunner

    from anywool import _validate
    from anywool.cli import main

    monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setattr(_validate, "_missing", lambda name: name == module)
    result = CliRunner(env={"ANYWOOL_SECRET": "s" * 32}).invoke(
        main, ["worker", "--namespace", "jobs", *args])
    assert result.exit_code == 1
    assert f"needs {module}, which is not installed here: pip install 'anywool[{extra}]'" \
        in result.output
    assert "Traceback" not in result.output
