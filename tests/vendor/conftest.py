"""Vendored reference code: imported by the tests, never collected (no doctests run)."""

collect_ignore_glob = ["*.py"]
