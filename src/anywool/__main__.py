"""``python -m anywool``: the ``anywool`` command without its console script."""

from anywool.cli import main

main()
