"""``python -m anywool.runtime._template BACKEND``: the pool's warm template process.

The command keeps this name (``ps`` shows it, and it is the ``__main__`` of every worker forked
from the template); the machinery lives in :mod:`anywool.runtime.pool._template_process`.
"""

from anywool.runtime.pool._template_process import main

if __name__ == "__main__":
    main()
