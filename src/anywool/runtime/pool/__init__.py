"""This host's workers: starting and stopping one (the local worker), the warm template they
fork from, and the pool that supervises them.

Runs in the pool's process. Internal; the public names are re-exported by :mod:`anywool`.
"""
