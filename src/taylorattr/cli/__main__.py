"""``python -m taylorattr.cli``: the same program as ``taylorattr``."""
import sys

from . import main

sys.exit(main())
