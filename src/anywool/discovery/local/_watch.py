"""The change hint: publishers touch a file after every change, sources watch it.

It is only a hint: a source also checks the registry's change counter every poll interval,
so a lost or coalesced hint delays an event by at most that long and never loses one. On Linux
the watch is inotify; elsewhere there is none and sources poll.
"""

from __future__ import annotations

import logging
import os
import sys

from anywool.discovery.local._flock import open_file

log = logging.getLogger("anywool.discovery.local")

if sys.platform == "linux":
    try:
        import inotify_simple
    except ImportError:  # pragma: no cover - the dependency is declared for Linux
        inotify_simple = None
else:  # pragma: no cover
    inotify_simple = None


def touch_hint(notify_fd: int, dir_fd: int) -> None:
    """Write the change hint of a generation (inotify reports IN_MODIFY): through ``notify_fd``
    when its holder keeps the file open, else opened through ``dir_fd``, the generation's
    directory. Best effort: it is only a hint."""
    fd = notify_fd
    if fd < 0:
        try:
            fd = open_file("notify", os.O_WRONLY, dir_fd=dir_fd)
        except OSError:
            return
    try:
        os.pwrite(fd, b"\x01", 0)
    except OSError:
        pass
    finally:
        if fd != notify_fd:
            os.close(fd)


class Watcher:
    """The hint watcher of one source: inotify on Linux, nothing (pure polling) elsewhere."""

    _FILE_EVENTS = 0
    _DIR_EVENTS = 0

    def __init__(self) -> None:
        self._inotify = None
        self._watch: int | None = None
        if inotify_simple is not None:
            flags = inotify_simple.flags
            self._FILE_EVENTS = (flags.MODIFY | flags.ATTRIB | flags.CLOSE_WRITE
                                 | flags.DELETE_SELF | flags.MOVE_SELF)
            self._DIR_EVENTS = flags.MOVED_TO | flags.CREATE | flags.ONLYDIR
            try:
                self._inotify = inotify_simple.INotify()
            except OSError as exc:  # e.g. EMFILE: the user's inotify instances are used up
                _warn_once(exc)

    def fileno(self) -> int | None:
        return None if self._inotify is None else self._inotify.fileno()

    def watch(self, path: os.PathLike[str] | str, directory: bool = False) -> None:
        if self._inotify is None:
            return
        self.unwatch()
        try:
            self._watch = self._inotify.add_watch(
                os.fspath(path), self._DIR_EVENTS if directory else self._FILE_EVENTS)
        except OSError:
            self._watch = None  # gone already: polling covers it

    def unwatch(self) -> None:
        if self._inotify is not None and self._watch is not None:
            try:
                self._inotify.rm_watch(self._watch)
            except OSError:
                pass  # the kernel dropped it when the file went away
        self._watch = None

    def drain(self) -> None:
        if self._inotify is not None:
            self._inotify.read(timeout=0)

    def close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None


_warned = False


def _warn_once(exc: OSError) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning("no inotify instance for the discovery change hint (%s): subscribers poll "
                    "instead, every poll_interval", exc)
