"""No module imports another module's private names.

A name with a leading underscore belongs to its module: another module that imports it leans
on a detail its owner may change without a word. What the package shares goes by a name
without one (``Call``, ``seconds_left``), however private the module that holds it; importing
a private *module* (``from anywool.runtime.wire import _auth``) is how the package is built,
and is fine; reaching a private name through it (``_auth._cache``) is the same lean as
importing the name, and is reported too. Lazy imports and those under ``TYPE_CHECKING`` count.
This reads ``src/`` only: tests may reach into internals.
"""

from __future__ import annotations

import ast
from pathlib import Path

from .test_layers import SRC, from_imports


def private_imports(root: Path = SRC) -> list[str]:
    """``path:line: from module import _name`` for every import of a private name (one
    underscore first, not a dunder) that is not a module, from an ``anywool`` module, in every
    module under ``root``."""
    wrong = []
    for path in sorted((root / "anywool").rglob("*.py")):
        for line, source, name, is_module in from_imports(path, root):
            ours = source == "anywool" or source.startswith("anywool.")
            if ours and name.startswith("_") and not name.startswith("__") and not is_module:
                wrong.append(f"{path.relative_to(root)}:{line}: from {source} import {name}")
    return wrong


def private_attributes(root: Path = SRC) -> list[str]:
    """``path:line: module._name`` for every private name read through an ``anywool`` module
    that ``path`` imported (``from anywool.x import _mod [as m]``, ``import anywool.x as m``)."""
    wrong = []
    for path in sorted((root / "anywool").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        modules = {}  # the local name of each anywool module imported -> its dotted name
        for line, source, name, is_module in from_imports(path, root):
            if is_module and (source == "anywool" or source.startswith("anywool.")):
                modules[name] = f"{source}.{name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):  # aliases: from x import _mod as m
                for alias in node.names:
                    if alias.asname and alias.name in modules:
                        modules[alias.asname] = modules[alias.name]
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name.startswith("anywool."):
                        modules[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in modules and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                wrong.append(f"{path.relative_to(root)}:{node.lineno}: "
                             f"{modules[node.value.id]}.{node.attr}")
    return wrong


def test_no_module_imports_another_modules_private_name() -> None:
    assert private_imports() == []


def test_no_module_reads_a_private_name_through_another_module() -> None:
    assert private_attributes() == []


def test_a_private_name_read_through_a_module_is_reported(tmp_path: Path) -> None:
    package = tmp_path / "anywool" / "runtime"
    package.mkdir(parents=True)
    (package / "_frames.py").write_text("LIMIT = 1\n_SECRET = 2\n")
    (package / "_user.py").write_text(
        "from anywool.runtime import _frames\n"
        "from anywool.runtime import _frames as frames\n"
        "import anywool.runtime._frames as f\n"
        "a = _frames.LIMIT + _frames.__name__.count('.')\n"
        "b = _frames._SECRET\n"
        "def g():\n"
        "    return frames._SECRET + f._SECRET\n")
    assert private_attributes(tmp_path) == [
        "anywool/runtime/_user.py:5: anywool.runtime._frames._SECRET",
        "anywool/runtime/_user.py:7: anywool.runtime._frames._SECRET",
        "anywool/runtime/_user.py:7: anywool.runtime._frames._SECRET",
    ]


def test_a_private_name_import_is_reported(tmp_path: Path) -> None:
    # A copy of the tree where one module imports a module (fine), a public name (fine), a
    # dunder (fine) and, lazily, a private name: the check names the last alone.
    package = tmp_path / "anywool" / "runtime"
    package.mkdir(parents=True)
    (package / "_frames.py").write_text("__version__ = '1'\nLIMIT = 1\n_SECRET = 2\n")
    (package / "_user.py").write_text(
        "from anywool.runtime import _frames\n"
        "from anywool.runtime._frames import LIMIT, __version__\n"
        "def f():\n"
        "    from ._frames import _SECRET\n")
    assert private_imports(tmp_path) == [
        "anywool/runtime/_user.py:4: from anywool.runtime._frames import _SECRET"]
