"""The ``errno`` values anywool treats alike, in one place.

No I/O here: constants only.
"""

from __future__ import annotations

import errno

#: The process or the system ran out of something (descriptors, memory, buffers): a condition of
#: the moment, to report or wait out, never a sign that a file or peer is broken.
EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})


def exhausted(exc: BaseException | None) -> bool:
    """Whether ``exc`` is an ``OSError`` of :data:`EXHAUSTED`."""
    return isinstance(exc, OSError) and exc.errno in EXHAUSTED
