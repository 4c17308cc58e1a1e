"""The package's layers import only downwards, lazy imports and type-checking ones included.

The layers, lowest first (the architecture page draws them): the root vocabulary (errors,
metadata, addresses, owners, ...), discovery, the wire (bytes between two processes), the
features with one end in each process, the caller (client), one worker process (worker), this
host's workers (pool), and on top the public modules, the command line and the pytest plugin.
A module may import its own layer and any below it; an import that goes up is reported with
its file and line, so that a new one fails here before it tangles the layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

#: Layers, lowest first: (name, members). A member ending in ``.*`` is a package and every
#: module below it; any other is one module (or package ``__init__``) exactly. A module of the
#: package's root whose name starts with an underscore is root vocabulary unless listed
#: elsewhere; any other module must be listed, so that a new one is placed on purpose (a
#: default of "top" would let it import anything).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("root", ("anywool.errors", "anywool.metadata")),
    ("discovery", ("anywool.discovery.*",)),
    ("wire", ("anywool.runtime.wire.*",)),
    ("shared", ("anywool.runtime._routine", "anywool.runtime._context",
                "anywool.runtime._output", "anywool.runtime._telemetry",
                "anywool.runtime._lifespan", "anywool.runtime._socket_dir",
                "anywool.runtime._batch", "anywool.runtime._map")),
    ("client", ("anywool.runtime.client.*",)),
    ("worker", ("anywool.runtime.worker.*",)),
    ("pool", ("anywool.runtime.pool.*",)),
    ("top", ("anywool", "anywool.runtime", "anywool.runtime._template", "anywool.lowlevel",
             "anywool.worker", "anywool.cli.*", "anywool.testing.*", "anywool._demo",
             "anywool.__main__")),
)


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module`` (a dotted name under ``anywool``).

    :raises AssertionError: the module is in no layer.
    """
    for index, (_, members) in enumerate(LAYERS):
        for member in members:
            if member.endswith(".*"):
                package = member[:-2]
                if module == package or module.startswith(package + "."):
                    return index
            elif module == member:
                return index
    parts = module.split(".")
    if len(parts) == 2 and parts[1].startswith("_"):
        return 0
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def from_imports(path: Path, root: Path) -> list[tuple[int, str, str, bool]]:
    """``(line, module, name, is_module)`` for every ``from module import name`` in ``path``,
    at any depth (in functions, under ``TYPE_CHECKING``), a relative ``module`` resolved;
    ``is_module``: ``name`` is a submodule of ``module`` (under ``root``)."""
    package = module_name(path, root)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found: list[tuple[int, str, str, bool]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        for alias in node.names:
            candidate = root / Path(*f"{source}.{alias.name}".split("."))
            is_module = candidate.with_suffix(".py").exists() or (
                candidate / "__init__.py").exists()
            found.append((node.lineno, source, alias.name, is_module))
    return found


def dynamic_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, module)`` for every module named by a string literal where it is imported or
    looked up at run time: ``importlib.import_module("m")``, ``__import__("m")``,
    ``sys.modules["m"]``, ``sys.modules.get("m")``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        named: ast.expr | None = None
        if isinstance(node, ast.Call) and node.args:
            function = node.func
            if (isinstance(function, ast.Attribute) and function.attr == "import_module") or (
                    isinstance(function, ast.Name) and function.id in (
                        "import_module", "__import__")):
                named = node.args[0]
            elif (isinstance(function, ast.Attribute) and function.attr == "get"
                  and _is_sys_modules(function.value)):
                named = node.args[0]
        elif isinstance(node, ast.Subscript) and _is_sys_modules(node.value):
            named = node.slice
        if isinstance(named, ast.Constant) and isinstance(named.value, str):
            found.append((node.lineno, named.value))
    return found


def _is_sys_modules(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "modules"
            and isinstance(node.value, ast.Name) and node.value.id == "sys")


def imported(path: Path, root: Path) -> list[tuple[int, str]]:
    """``(line, module)`` for every import of an ``anywool`` module in ``path``, at any depth
    (in functions, under ``TYPE_CHECKING``), ``from package import submodule`` resolved to
    the submodule."""
    tree = ast.parse(path.read_text(), str(path))
    found = [(node.lineno, alias.name) for node in ast.walk(tree)
             if isinstance(node, ast.Import) for alias in node.names]
    found.extend(dynamic_imports(tree))
    found.extend((line, f"{source}.{name}" if is_module else source)
                 for line, source, name, is_module in from_imports(path, root))
    return sorted((line, module) for line, module in found
                  if module == "anywool" or module.startswith("anywool."))


def upward_imports(root: Path = SRC) -> list[str]:
    wrong = []
    for path in sorted((root / "anywool").rglob("*.py")):
        importer = module_name(path, root)
        level = layer_of(importer)
        for line, module in imported(path, root):
            if layer_of(module) > level:
                wrong.append(f"{path.relative_to(root)}:{line}: {importer} ({LAYERS[level][0]}) "
                             f"imports {module} ({LAYERS[layer_of(module)][0]})")
    return wrong


def test_no_module_imports_a_layer_above_its_own() -> None:
    assert upward_imports() == []


@pytest.mark.parametrize(("module", "layer"), [
    ("anywool.errors", "root"), ("anywool._tls", "root"),
    ("anywool.discovery.local._claim", "discovery"),
    ("anywool.runtime.wire._frames", "wire"), ("anywool.runtime._output", "shared"),
    ("anywool.runtime.client._proxy", "client"), ("anywool.runtime.worker._server", "worker"),
    ("anywool.runtime.pool._pool", "pool"), ("anywool.runtime", "top"),
    ("anywool", "top"), ("anywool.cli._ops", "top"), ("anywool.runtime._template", "top"),
    ("anywool._a_new_vocabulary", "root"), ("anywool.runtime.wire", "wire"),
])
def test_modules_fall_in_their_layers(module: str, layer: str) -> None:
    assert LAYERS[layer_of(module)][0] == layer


def test_an_upward_import_is_reported(tmp_path: Path) -> None:
    # A copy of the tree with upward imports of every kind, lazy ones: the check names each.
    tree = tmp_path / "src"
    wire = tree / "anywool" / "runtime" / "wire"
    wire.mkdir(parents=True)
    (wire / "_frames.py").write_text(
        "import importlib, sys\n"
        "def f():\n"
        "    from anywool.runtime.pool._pool import WorkerPool\n"
        "    from ..pool import _pool\n"
        "    importlib.import_module('anywool.runtime.pool._pool')\n"
        "    return sys.modules['anywool.runtime.client._proxy']\n")
    for package in ("pool", "client"):
        (tree / "anywool" / "runtime" / package).mkdir()
    (tree / "anywool" / "runtime" / "pool" / "_pool.py").write_text("")
    (tree / "anywool" / "runtime" / "client" / "_proxy.py").write_text("")
    prefix = "anywool/runtime/wire/_frames.py"
    importer = "anywool.runtime.wire._frames (wire) imports"
    assert upward_imports(tree) == [
        f"{prefix}:3: {importer} anywool.runtime.pool._pool (pool)",
        f"{prefix}:4: {importer} anywool.runtime.pool._pool (pool)",
        f"{prefix}:5: {importer} anywool.runtime.pool._pool (pool)",
        f"{prefix}:6: {importer} anywool.runtime.client._proxy (client)",
    ]


def test_a_module_in_no_layer_is_refused() -> None:
    # A new module of the runtime must be placed on purpose, not let import anything.
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("anywool.runtime._new_feature")
