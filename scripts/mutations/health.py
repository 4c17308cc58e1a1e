"""Mutations of worker health (issue 24, item 4): another process's worker that does not take a
cancellation in time is left out of the choice until it answers again."""

from mutate import Mutation

MUTATIONS: list[Mutation] = [
    Mutation(
        name="health-unresponsive-foreign-worker-kept",
        path="src/anywool/runtime/client/_proxy.py",
        old="""        self._unready(uid, entry[1])
        admitted.wakeup.set()  # its connection closes; reconnected, with back-off""",
        new="""        pass""",
        tests=("tests/integration/test_health.py",),
        why="issue 24: a worker whose calls fail at the transport level is ejected from the "
            "choice",
    ),
    Mutation(
        name="health-ejected-worker-never-readmitted",
        path="src/anywool/runtime/client/_proxy.py",
        old="""        admitted.wakeup.set()  # its connection closes; reconnected, with back-off""",
        new="""        admitted.dropped = True
        admitted.wakeup.set()""",
        tests=("tests/integration/test_health.py",),
        why="issue 24: never orphaned for good while discovery still announces it (wool#301)",
    ),
]
