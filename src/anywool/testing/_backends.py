"""Both AnyIO backends on request: the ``anywool_backends`` ini option and marker.

AnyIO's pytest plugin runs an async test under whatever its ``anyio_backend`` fixture returns.
Here, and only when asked:

- the ini option ``anywool_backends`` (e.g. ``asyncio trio``) provides a module-scoped
  ``anyio_backend`` fixture parametrised over those backends, for the whole suite. It is
  registered from :func:`pytest_configure`, after AnyIO's plugin, and a fixture of a plugin
  registered later overrides one of the same name registered earlier; a ``conftest.py``'s
  ``anyio_backend`` overrides any plugin's, this one's included. Unset, nothing is registered.
- the marker ``@pytest.mark.anywool_backends("asyncio", "trio")`` (no arguments: both)
  parametrises ``anyio_backend`` of the marked test, class or module (module scope), over
  whatever fixture would have provided it.

Backend names are checked at once: anything but ``"asyncio"`` and ``"trio"``, or a backend
that is not installed, is a :class:`pytest.UsageError` naming it. Nothing here imports anyio,
trio or anywool.
"""

from __future__ import annotations

import importlib.util
import types
from collections.abc import Iterable

import pytest

BACKENDS = ("asyncio", "trio")
_INI = "anywool_backends"
_MARKER = "anywool_backends"


def backend_names(values: Iterable[object], where: str) -> tuple[str, ...]:
    """The backends ``values`` names, in order, once each.

    Each value may hold several names separated by whitespace (``"asyncio trio"``).

    :raises pytest.UsageError: a value is not a string, or names something other than
        ``"asyncio"`` or ``"trio"``, or a backend that is not installed; the message says
        ``where`` it came from.
    """
    names: list[str] = []
    for value in values:
        if not isinstance(value, str):
            raise pytest.UsageError(f"{where}: backend names are strings, got {value!r}")
        for name in value.split():
            if name not in BACKENDS:
                raise pytest.UsageError(
                    f"{where}: unknown AnyIO backend {name!r} (choose from "
                    f"{', '.join(map(repr, BACKENDS))})")
            if name != "asyncio" and importlib.util.find_spec(name) is None:
                raise pytest.UsageError(f"{where}: backend {name!r} is not installed "
                                        f"(pip install {name})")
            if name not in names:
                names.append(name)
    return tuple(names)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        _INI,
        type="linelist",
        default=[],
        help="AnyIO backends every async test runs under, e.g. 'asyncio trio' (anywool's "
             "plugin provides a module-scoped anyio_backend fixture over them)",
    )


def _backend_fixture_plugin(names: tuple[str, ...]) -> types.ModuleType:
    """A plugin (a module object, as most plugins are) holding a module-scoped
    ``anyio_backend`` fixture parametrised over ``names``."""

    @pytest.fixture(scope="module", params=names)
    def anyio_backend(request: pytest.FixtureRequest) -> str:
        """The AnyIO backend of this module's async tests: each of the ``anywool_backends``
        ini option's names in turn (anywool's plugin)."""
        return request.param

    plugin = types.ModuleType("anywool.testing.backends", "anyio_backend over anywool_backends")
    plugin.anyio_backend = anyio_backend  # type: ignore[attr-defined]
    return plugin


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{_MARKER}(*names): run the async tests marked (a test, a class or a module) under "
        "each named AnyIO backend, 'asyncio' and 'trio' when none is named",
    )
    names = backend_names(config.getini(_INI), f"the {_INI} ini option")
    if names:
        config.pluginmanager.register(_backend_fixture_plugin(names), "anywool-backends")


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker(_MARKER)
    if marker is None or "anyio_backend" not in metafunc.fixturenames:
        return
    if marker.kwargs:
        raise pytest.UsageError(f"@pytest.mark.{_MARKER} takes backend names only, got "
                                f"{marker.kwargs!r}")
    names = backend_names(marker.args, f"@pytest.mark.{_MARKER} on {metafunc.definition.nodeid}")
    # As a parametrize mark, added before pytest's own hooks run (tryfirst): they then
    # parametrise the test with it, and leave alone whichever anyio_backend fixture would have
    # parametrised it (parametrising it here directly would collide with that fixture's).
    metafunc.definition.add_marker(
        pytest.mark.parametrize("anyio_backend", names or BACKENDS, scope="module"))
