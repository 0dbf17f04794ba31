"""Building blocks of :mod:`taylorattr.experiments.evaluate`: dataset items, sharding,
the job lock, the job frame and the merge."""
