"""Tests against real etcd servers (:mod:`tests.etcd.cluster` starts them)."""
