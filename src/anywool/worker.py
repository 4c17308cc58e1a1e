"""``python -m anywool.worker``: run one worker process (see :mod:`anywool.runtime.worker._main`)."""

from anywool.runtime.worker._main import main

if __name__ == "__main__":
    main()
