"""Building blocks of :mod:`taylorattr.experiments.evaluate`: dataset items, sharding,
the job lock, the job frame and the merge."""
from . import items, lock  # the command line reads the items and the lock through the package

__all__ = ["items", "lock"]
