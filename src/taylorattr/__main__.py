"""``python -m taylorattr``: the command line (:mod:`taylorattr.cli`)."""
import sys

from .cli import main

sys.exit(main())
