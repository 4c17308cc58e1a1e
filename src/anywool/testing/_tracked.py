"""The WorkerPool the ``worker_pool`` fixture hands out: a plain pool that keeps a record.

It records whether it was entered and exited, and the identity of every worker process it
adopted, its first workers and every replacement alike, the moment it adopts it (while the
process is certainly alive), so that the fixture can tell afterwards whether all of them are
gone. It changes nothing the pool does. Imported only when a test calls the factory: it
imports the whole runtime.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Literal

from anywool.runtime._local_worker import LocalWorker
from anywool.runtime._pool import WorkerPool
from anywool.testing._processes import Identity, identify

Stage = Literal["made", "entering", "entered", "failed", "exited"]


class TrackedWorkerPool(WorkerPool):
    """A :class:`~anywool.WorkerPool` that records its stage and the workers it spawned."""

    _single_use_name = "WorkerPool"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stage: Stage = "made"
        #: Every worker process this pool adopted, in order.
        self.spawned: list[Identity] = []

    def _adopted(self, worker: LocalWorker) -> None:
        self.spawned.append(identify(worker.pid))

    async def __aenter__(self) -> TrackedWorkerPool:
        if self.stage == "made":
            self.stage = "entering"
        try:
            await super().__aenter__()
        except BaseException:
            if self.stage == "entering":
                self.stage = "failed"  # it exited whatever it had entered before raising
            raise
        self.stage = "entered"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await super().__aexit__(exc_type, exc, tb)
        finally:
            if self.stage == "entered":
                self.stage = "exited"
