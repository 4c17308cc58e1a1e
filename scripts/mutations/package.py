"""Mutations of what a user meets on first contact (issue 25): the trio extra named when trio
is asked for and missing."""

from mutate import Mutation

MUTATIONS: list[Mutation] = [
    Mutation(
        name="trio-missing-unsaid",
        path="src/anywool/_validate.py",
        old="""    if value == "trio" and "trio" not in sys.modules and _missing("trio"):""",
        new="""    if False:""",
        tests=("tests/unit/test_validate.py::"
               "test_the_trio_backend_without_trio_names_the_extra_to_install",),
        why="issue 25: asking for trio without it names anywool[trio]",
    ),
]
