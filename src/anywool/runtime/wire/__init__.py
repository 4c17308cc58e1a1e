"""The bytes between two processes: sockets, frames, the envelope of a call, pickling,
exceptions across processes, peer authentication and the statistics message.

Nothing here knows of routines, proxies, pools or processes: both ends import it. Internal,
like every module below :mod:`anywool.runtime`; the public names are re-exported by
:mod:`anywool`.
"""
