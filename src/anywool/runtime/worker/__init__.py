"""One worker process: its main, the server that runs calls, and what keeps it in bounds
(interrupts, the lifeline, admission of handshakes), plus the contract between a pool and its
workers (:mod:`._contract`), which is the only module of this package a pool's process imports.

Internal; the public names are re-exported by :mod:`anywool`.
"""
