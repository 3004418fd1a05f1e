"""Fixture writers for tests and benchmarks. Production code never imports this package."""
