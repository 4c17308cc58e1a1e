"""The WorkerPool the ``worker_pool`` fixture hands out: a plain pool that keeps a record.

It records the identity of every worker process it adopted, its first workers and every
replacement alike, the moment it adopts it (while the process is certainly alive), so that the
fixture can tell afterwards whether all of them are gone. Whether it was entered and exited the
pool itself tells. It changes nothing the pool does. Imported only when a test calls the factory: it
imports the whole runtime.
"""

from __future__ import annotations

from typing import Any

from anywool.runtime.pool._local_worker import LocalWorker
from anywool.runtime.pool._pool import WorkerPool
from anywool.testing._processes import Identity, identify


class TrackedWorkerPool(WorkerPool):
    """A :class:`~anywool.WorkerPool` that records the workers it spawned."""

    _single_use_name = "WorkerPool"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: Every worker process this pool adopted, in order.
        self.spawned: list[Identity] = []

    def _adopted(self, worker: LocalWorker) -> None:
        self.spawned.append(identify(worker.pid))
