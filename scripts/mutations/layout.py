"""Mutations of the package's layout: layers import only downwards, and the runtime's internal
packages stay out of the public API."""

from mutate import Mutation

MUTATIONS: list[Mutation] = [
    Mutation(
        name="discovery-imports-the-runtime",
        path="src/anywool/discovery/etcd/_config.py",
        old="from anywool._tls import MutualTLS\n",
        new="from anywool.runtime.wire._auth import MutualTLS\n",
        tests=("tests/unit/test_layers.py::test_no_module_imports_a_layer_above_its_own",),
        why="architecture: discovery never imports the runtime",
    ),
    Mutation(
        name="wire-imports-the-front-door-lazily",
        path="src/anywool/runtime/wire/_stats.py",
        old="def memory() -> tuple[int | None, bool]:\n",
        new="def _version() -> str:\n    from anywool import __version__\n\n    return __version__\n\n\n"
            "def memory() -> tuple[int | None, bool]:\n",
        tests=("tests/unit/test_layers.py::test_no_module_imports_a_layer_above_its_own",),
        why="architecture: an import that goes up fails, a lazy one included",
    ),
    Mutation(
        name="internal-packages-listed-by-dir",
        path="src/anywool/_lazy.py",
        old="                      and name not in internal}",
        new="}",
        tests=("tests/unit/test_public_api.py::"
               "test_the_runtimes_internal_packages_stay_out_of_dir_once_imported",),
        why="dir(anywool.runtime) lists the public API only",
    ),
    Mutation(
        name="a-moved-logger-takes-its-modules-name",
        path="src/anywool/runtime/client/_proxy.py",
        old='log = logging.getLogger("anywool.runtime._proxy")',
        new="log = logging.getLogger(__name__)",
        tests=("tests/unit/test_logger_names.py",),
        why="logger names stay what users configure",
    ),
    Mutation(
        name="wire-looks-up-the-pool-at-run-time",
        path="src/anywool/runtime/wire/_stats.py",
        old="def memory() -> tuple[int | None, bool]:\n",
        new="def _pool() -> object:\n    import sys\n\n"
            "    return sys.modules.get(\"anywool.runtime.pool._pool\")\n\n\n"
            "def memory() -> tuple[int | None, bool]:\n",
        tests=("tests/unit/test_layers.py::test_no_module_imports_a_layer_above_its_own",),
        why="architecture: a module looked up by name at run time is an import too",
    ),
    Mutation(
        name="a-private-name-read-through-its-module",
        path="src/anywool/runtime/wire/_exceptions.py",
        old="    exits = _serializer.UNPICKLING_EXITS",
        new="    exits = _serializer._UNPICKLING_EXITS",
        tests=("tests/unit/test_private_names.py::"
               "test_no_module_reads_a_private_name_through_another_module",),
        why="no module leans on another module's private names",
    ),
    # Paths counted from a module's own depth, which a move changes (as it once did).
    Mutation(
        name="interrupter-machinery-counted-from-its-own-folder",
        path="src/anywool/runtime/worker/_interrupt.py",
        old='    roots = [os.path.join(PACKAGE, "runtime") + os.sep,',
        new="    roots = [os.path.dirname(os.path.abspath(__file__)) + os.sep,",
        tests=("tests/unit/test_location.py",),
        why="an interruption is never raised into anywool's own code",
    ),
    Mutation(
        name="worker-path-counted-from-its-own-folder",
        path="src/anywool/runtime/pool/_local_worker.py",
        old='            [IMPORT_ROOT, *filter(None, [env.get("PYTHONPATH")])]',
        new='            [str(Path(__file__).resolve().parents[2]), '
            '*filter(None, [env.get("PYTHONPATH")])]',
        tests=("tests/integration/test_pool_imports.py::test_workers_and_the_template_import_this_anywool_first",),
        why="a worker imports the anywool of its pool, and nothing of it as top-level modules",
    ),
    Mutation(
        name="template-path-counted-from-its-own-folder",
        path="src/anywool/runtime/pool/_template.py",
        old='[IMPORT_ROOT, *filter(None, [env.get("PYTHONPATH")])]',
        new='[os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), '
            '*filter(None, [env.get("PYTHONPATH")])]',
        tests=("tests/integration/test_pool_imports.py::test_workers_and_the_template_import_this_anywool_first",),
        why="the template imports the anywool of its pool",
    ),
]
