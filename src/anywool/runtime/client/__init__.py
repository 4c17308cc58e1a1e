"""The caller's side: a connection to one worker, the calls made over it, the proxy that admits
and balances workers, and resolving what a pool is given.

Runs in the caller's process (and in a worker, for the routines its routines call). Internal;
the public names are re-exported by :mod:`anywool`.
"""
