"""Throwaway local PostgreSQL clusters for the demo, the tests and the benchmarks.

Not on the daemon's runtime path: only `pgworkerd demo` imports it."""
