"""``python -m anywool.worker``: run one worker process (see :mod:`anywool.runtime._worker`)."""

from anywool.runtime._worker import main

if __name__ == "__main__":
    main()
