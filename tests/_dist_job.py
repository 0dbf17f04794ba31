"""A tiny evaluation job for the torchrun tests: ``python _dist_job.py OUT [KILL_MARKER]``.

A small float64 network and 24 random 1x6x6 inputs (fixed seeds, so every process and
every run builds the same ones). When the file KILL_MARKER exists, the process that reads
item ``KILL_AT`` deletes the marker and SIGKILLs itself: a rank dies mid-unit, exactly
once. Prints ``computed=<c> reused=<r> rank=<k>``.
"""
import os
import signal
import sys

import torch
from torch import nn

from taylorattr.experiments.evaluate import evaluate
from taylorattr.models import Square

N, KILL_AT, BATCH = 24, 18, 2


class Items(torch.utils.data.Dataset):
    def __init__(self, marker):
        g = torch.Generator().manual_seed(0)
        self.x = torch.rand(N, 1, 6, 6, generator=g, dtype=torch.float64)
        self.y = torch.randint(0, 3, (N,), generator=g)
        self.marker = marker

    def __len__(self):
        return N

    def __getitem__(self, i):
        if i == KILL_AT and self.marker and os.path.exists(self.marker):
            os.unlink(self.marker)
            os.kill(os.getpid(), signal.SIGKILL)
        return self.x[i], int(self.y[i])


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(36, 8), Square(), nn.Linear(8, 3)).double()


if __name__ == "__main__":
    out = sys.argv[1]
    marker = sys.argv[2] if len(sys.argv) > 2 else None
    r = evaluate(model(), Items(marker), ["GI", "IG", "EG"], ["infidelity"], out=out,
                    batch_size=BATCH, seed=3, infidelity_options={"max_side": 3}, device="cpu")
    print(f"computed={r.computed} reused={r.reused} rank={r.rank}", flush=True)
