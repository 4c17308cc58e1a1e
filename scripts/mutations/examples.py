"""Mutations of issue 21's own examples (each passed the whole suite before it)."""

from mutate import Mutation

MUTATIONS: list[Mutation] = []
