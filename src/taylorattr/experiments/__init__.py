"""Experiments of the paper; each returns data and writes tables, never prints.

Importing the package registers the paper's rows on top of the library's registry
(:mod:`taylorattr.paper_methods`), so every experiment sees the paper's variants.
"""
from .. import paper_methods as _paper_methods  # noqa: F401  (registers the paper's rows)
