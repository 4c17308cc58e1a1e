"""The loggers anywool writes to keep their names: users configure logging by name, and a
module that moves must not take its logger's name along (so the runtime's loggers are string
literals, the names their modules had before the runtime was laid out by side)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

LOGGERS = {
    "anywool.discovery._hub", "anywool.discovery.etcd._etcd", "anywool.discovery.etcd._gateway",
    "anywool.discovery.etcd._lease", "anywool.discovery.etcd._source",
    "anywool.discovery.lan._lan", "anywool.discovery.lan._source", "anywool.discovery.local",
    "anywool.discovery.local._local", "anywool.output", "anywool.telemetry", "anywool.testing",
    "anywool.worker", "anywool.runtime._asyncio_loop", "anywool.runtime._connection",
    "anywool.runtime._local_worker", "anywool.runtime._nested", "anywool.runtime._pool",
    "anywool.runtime._proxy", "anywool.runtime._template",
}


def logger_names() -> dict[str, str]:
    """Each module-level ``logging.getLogger(...)`` of ``src/``: the logger's name, by the
    module (``__name__`` resolved to the module's dotted name)."""
    found: dict[str, str] = {}
    for path in sorted((SRC / "anywool").rglob("*.py")):
        module = ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.parse(path.read_text()).body:
            call = node.value if isinstance(node, ast.Assign) else None
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "getLogger" and call.args):
                argument = call.args[0]
                if isinstance(argument, ast.Name) and argument.id == "__name__":
                    found[module] = module
                else:
                    assert isinstance(argument, ast.Constant), f"{module}: a name, not a literal"
                    found[module] = argument.value
    return found


def test_every_logger_keeps_its_name() -> None:
    assert set(logger_names().values()) == LOGGERS


def test_the_runtimes_loggers_are_literals() -> None:
    # __name__ would follow the module when it moves.
    named_by_module = [module for module, name in logger_names().items()
                       if module.startswith("anywool.runtime.") and name == module]
    assert named_by_module == []
