"""``python _dist_reproduce.py OUT``: the tiny reproduce of tests/test_report.py (a process of
a torchrun job or a single process)."""
import sys

from taylorattr.experiments.reproduce import ReproduceSettings, reproduce

TINY = ReproduceSettings(validation_samples=4, validation_orders=(2, 3), assessment_samples=2,
                         quick=True, digits=1, photos=(), epochs=0, interaction_samples=2)

if __name__ == "__main__":
    reproduce(sys.argv[1], show_progress=False, settings=TINY)
