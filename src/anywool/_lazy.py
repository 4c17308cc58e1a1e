"""Package attributes imported on first use (PEP 562), so that importing a package costs only
what is used of it.

A worker process runs ``python -m anywool.worker``, which imports the ``anywool`` package first:
with every public name imported eagerly that was the whole library (LAN discovery and zeroconf
included), about 120 ms of each worker's start-up. Each package's ``__init__`` names its public
attributes and their modules here instead, and imports them for type checkers only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Mapping
from types import ModuleType
from typing import Any


def exports(package: str, where: Mapping[str, str], internal: Collection[str] = ()
            ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose public name ``n`` lives in the module
    ``where[n]``; a name, once imported, is set on the package (later lookups are plain).
    ``dir(package)`` lists the public API only: ``internal`` names subpackages that hold
    machinery under names without an underscore (``anywool.runtime.wire``)."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            # A submodule (``anywool.errors``): eager imports used to bind them all, so code
            # that only imported the package may use them.
            if not name.startswith("__"):
                try:
                    return importlib.import_module(f"{package}.{name}")
                except ModuleNotFoundError as exc:
                    if exc.name != f"{package}.{name}":
                        raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(importlib.import_module(package), name, value)
        return value

    def __dir__() -> list[str]:
        # The public API only: the exported names, the public submodules imported so far and
        # the version; not the machinery of the package's own header (TYPE_CHECKING, exports).
        namespace = vars(importlib.import_module(package))
        submodules = {name for name, value in namespace.items()
                      if isinstance(value, ModuleType) and not name.startswith("_")
                      and name not in internal}
        return sorted(set(where) | submodules | ({"__version__"} & namespace.keys()))

    return __getattr__, __dir__
