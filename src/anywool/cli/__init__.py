"""The ``anywool`` command.

* ``anywool demo``: hash files on a local worker pool, checking every digest
  (:mod:`anywool.cli._demo_command`);
* ``anywool worker``: host workers announced into a namespace, on this host or to the LAN,
  until SIGINT or SIGTERM (:mod:`anywool.cli._worker_command`).

Presentation only (click, rich): the work is the library's.
"""

from __future__ import annotations

import click

from anywool.cli._demo_command import demo
from anywool.cli._worker_command import worker

__all__ = ["main"]


@click.group()
@click.version_option(package_name="anywool")
def main() -> None:
    """anywool: run async routines on worker processes found through discovery."""


main.add_command(demo)
main.add_command(worker)
