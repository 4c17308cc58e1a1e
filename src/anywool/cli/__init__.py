"""The ``anywool`` command.

* ``anywool demo``: hash files on a local worker pool, checking every digest
  (:mod:`anywool.cli._demo_command`);
* ``anywool worker``: host workers announced into a namespace, on this host, to the LAN or in an
  etcd cluster, until SIGINT or SIGTERM (:mod:`anywool.cli._worker_command`);
* operations on this host's runtime directory (what they share is :mod:`anywool.cli._ops`):
  ``anywool ls`` lists its namespaces, ``anywool show NS`` one namespace and its workers,
  ``anywool watch NS`` follows its workers live, ``anywool reclaim [NS]`` removes what dead
  processes left (:mod:`anywool.cli._ls_command`, ``_show_command``, ``_watch_command``,
  ``_reclaim_command``); with ``--etcd URL``, ``ls``, ``show`` and ``watch`` read an etcd
  cluster instead (the ``--etcd`` options and the reads: :mod:`anywool.cli._etcd_ops`);
* ``anywool top NS``: what each worker of a namespace is doing, asked of the workers themselves
  (:mod:`anywool.cli._top_command`);
* ``anywool recycle NS``: a rolling restart of the pools (``anywool worker`` hosts) serving a
  namespace, one host at a time, asked of their workers (:mod:`anywool.cli._recycle_command`).

Presentation only (click, rich): the work is the library's.
"""

from __future__ import annotations

import importlib

import click

__all__ = ["main"]


class _Commands(click.Group):
    """The commands, each imported when it is run (or listed): ``anywool ls`` does not pay for
    the demo's or the worker's imports, and a Ctrl-C while a command loads is click's
    "Aborted!" rather than a traceback."""

    _where = {
        "demo": "anywool.cli._demo_command",
        "worker": "anywool.cli._worker_command",
        "ls": "anywool.cli._ls_command",
        "show": "anywool.cli._show_command",
        "watch": "anywool.cli._watch_command",
        "top": "anywool.cli._top_command",
        "recycle": "anywool.cli._recycle_command",
        "reclaim": "anywool.cli._reclaim_command",
    }

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # The reader stopped early (``anywool show NS | head -1``): it has what it wanted,
            # which is not a failure (and status 1 means "not found" here).
            from anywool.cli._ops import silence_stdout

            silence_stdout()
            ctx.exit(0)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self._where)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = self._where.get(cmd_name)
        if module is None:
            return None
        command = getattr(importlib.import_module(module), cmd_name)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=_Commands)
@click.version_option(package_name="anywool")
def main() -> None:
    """anywool: run async routines on worker processes found through discovery."""
