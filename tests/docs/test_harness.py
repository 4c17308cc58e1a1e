"""The documentation harness's own rules (tests/docs/examples.py): which blocks run, how, and
what output matches."""

from __future__ import annotations

import pytest

from tests.docs.examples import blocks, matches

PAGE = """\
Intro.

```python
# file: helper.py
VALUE = 1
```

<!-- example: lan -->
```python
import anyio
anyio.run(main)
```

```text
one
...
last ... line
```

```sh
pip install anywool
```

<!-- example: skip needs a GPU -->
```python
anyio.run(main, backend="trio")
```

Some prose.

```text
not the output of the block above: prose stands between
```

<!-- example: pytest -->
```python
async def test_x(): anyio.run(f)
```
"""


def test_blocks_are_found_with_their_markers_helpers_and_output() -> None:
    found = blocks("page.md", PAGE)
    assert [(b.line, b.marker, b.reason, b.backends) for b in found] == [
        (9, "lan", "", ("asyncio", "trio")),
        (25, "skip", "needs a GPU", (None,)),
        (36, "pytest", "", (None,)),
    ]
    assert found[0].helpers == {"helper.py": "# file: helper.py\nVALUE = 1\n"}
    assert found[0].expected == "one\n...\nlast ... line"
    assert found[0].code == "import anyio\nanyio.run(main)\n"
    assert found[1].expected is None and found[2].expected is None


def test_an_unknown_marker_or_an_unclosed_block_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown example marker 'lna'"):
        blocks("p.md", "<!-- example: lna -->\n```python\npass\n```\n")
    with pytest.raises(ValueError, match="line 1: a code block that never ends"):
        blocks("p.md", "```python\npass\n")


@pytest.mark.parametrize(("expected", "actual", "result"), [
    ("a\nb", "a\nb\n", True),
    ("a\nb", "a  \nb", True),                  # trailing spaces do not count
    ("a\nb", "a\nb\nc\n", False),              # nothing more than shown
    ("a\nb", "a\n", False),
    ("a\n...\nz", "a\nz\n", True),             # ... is any number of lines, none included
    ("a\n...\nz", "a\nb\nc\nz\n", True),
    ("a\n...\nz", "a\nb\nc\n", False),
    ("took ... s", "took 0.25 s\n", True),     # ... within a line is any text
    ("took ... s", "took 0.25 ms\n", False),
    ("took ... s", "took\n0.25 s\n", False),   # but not more lines
    ("a.b", "axb\n", False),                   # the rest is literal
])
def test_output_matches_by_the_rules(expected: str, actual: str, result: bool) -> None:
    assert matches(expected, actual) is result
