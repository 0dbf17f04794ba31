"""Experiments of the paper; each returns data and writes tables, never prints."""
