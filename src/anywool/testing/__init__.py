"""anywool's pytest plugin: isolated runtime directories, pools checked after every test, both
AnyIO backends on request, and helpers that inject faults.

pytest loads this module by itself wherever anywool is installed (the ``pytest11`` entry point
``anywool``); it adds fixtures, a marker and an ini option, none of which acts unless a test or
the configuration asks for it. Import the fault helpers from here::

    from anywool.testing import hold_registry_lock, kill_worker, owner_process, suspended

Importing this module imports pytest and AnyIO (which AnyIO's own plugin loads anyway), and of
anywool only the package itself; the rest is imported when a fixture or helper is used.
"""

# pytest reads the plugin's hooks and fixtures from this module's namespace.
from anywool.testing._backends import pytest_addoption as pytest_addoption
from anywool.testing._backends import pytest_configure as pytest_configure
from anywool.testing._backends import pytest_generate_tests as pytest_generate_tests
from anywool.testing._faults import RegistryLock, hold_registry_lock, kill_worker, suspended
from anywool.testing._owner_process import OwnerProcess, owner_process
from anywool.testing._pools import WorkerPoolFactory, worker_pool
from anywool.testing._runtime import anywool_runtime_dir

__all__ = [
    "OwnerProcess",
    "RegistryLock",
    "WorkerPoolFactory",
    "anywool_runtime_dir",
    "hold_registry_lock",
    "kill_worker",
    "owner_process",
    "suspended",
    "worker_pool",
]
