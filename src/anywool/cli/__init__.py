"""The ``anywool`` command.

* ``anywool demo``: hash files on a local worker pool, checking every digest
  (:mod:`anywool.cli._demo_command`);
* ``anywool worker``: host workers announced into a namespace, on this host or to the LAN,
  until SIGINT or SIGTERM (:mod:`anywool.cli._worker_command`);
* operations on this host's runtime directory (what they share is :mod:`anywool.cli._ops`):
  ``anywool ls`` lists its namespaces, ``anywool show NS`` one namespace and its workers,
  ``anywool watch NS`` follows its workers live, ``anywool reclaim [NS]`` removes what dead
  processes left (:mod:`anywool.cli._ls_command`, ``_show_command``, ``_watch_command``,
  ``_reclaim_command``).

Presentation only (click, rich): the work is the library's.
"""

from __future__ import annotations

import click

from anywool.cli._demo_command import demo
from anywool.cli._ls_command import ls
from anywool.cli._reclaim_command import reclaim
from anywool.cli._show_command import show
from anywool.cli._watch_command import watch
from anywool.cli._worker_command import worker

__all__ = ["main"]


@click.group()
@click.version_option(package_name="anywool")
def main() -> None:
    """anywool: run async routines on worker processes found through discovery."""


main.add_command(demo)
main.add_command(worker)
main.add_command(ls)
main.add_command(show)
main.add_command(watch)
main.add_command(reclaim)
