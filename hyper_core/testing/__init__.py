"""Helpers for plugin authors' tests (a pytest plugin registered through ``pytest11``)."""
