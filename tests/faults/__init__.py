"""Fault injection for tests (see README.md here)."""
