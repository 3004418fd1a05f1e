"""Fixture writers and child-process helpers for tests and benchmarks. Production code never
imports this package."""
