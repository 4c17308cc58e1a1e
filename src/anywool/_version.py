"""The anywool version: one place the build reads (``[tool.hatch.version]``) and every module
imports from below the package's front door, which re-exports it as ``anywool.__version__``.
(Reading the installed metadata instead would import ``importlib.metadata``, about 30 ms of a
worker's start.)"""

__version__ = "0.1.0"
