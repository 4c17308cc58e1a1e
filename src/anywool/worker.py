"""``python -m anywool.worker``: run one worker process (see :mod:`anywool.runtime.worker`)."""

from anywool.runtime.worker import main

if __name__ == "__main__":
    main()
