"""The worker runtime: routines, the wire protocol, workers, proxies and pools."""
