"""Where this anywool is imported from, for the processes it starts and the code it must tell
from a user's.

Computed here, at the root of the package, from this module's own file: a module deeper down
that counted its own depth (``dirname`` three times, ``parents[2]``) would point somewhere else
as soon as it moved. No imports of anywool, no I/O.
"""

from __future__ import annotations

import os

__all__ = ["IMPORT_ROOT", "PACKAGE"]

#: The ``anywool`` package's directory (absolute, as Python names the files it imports: not
#: resolved through symbolic links, so that a frame's ``co_filename`` starts with it).
PACKAGE: str = os.path.dirname(os.path.abspath(__file__))
#: The directory that holds the package: what goes first on a child's ``PYTHONPATH`` so that
#: it imports this same anywool, whatever its ``sys.path`` says.
IMPORT_ROOT: str = os.path.dirname(PACKAGE)
