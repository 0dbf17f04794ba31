"""The first attribution call of a fresh process (issue 27): taylorattr's DeepLIFT (which
captures the model with torch.export, shared with Taylor mode) against Captum's DeepLift
(module hooks, no tracing), each in its own new Python process, first and second call timed
(imports of the two libraries excluded; torch.export's own modules load at the first call).

Ratios: ours first / ours second (the one-off cost), ours first / Captum first (the peer).
History: the torch.fx tracer of the first layer-wise engine recorded node source lines from
the Python stack, whose first use imported ~900 modules (4.1-4.4 s); without it the first
call took 0.03 s. The torch.export capture (issue 26) costs ~1.0-1.1 s of its own imports
(torch.export._trace loads torch._dynamo) plus ~0.4 s per new model structure, once per
process: 1.37 s first call, 1 ms second, against Captum's 3.2 ms (2 busy cores).
``--json PATH`` writes the rows; ``--quick``: 2 repeats instead of 5.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _timing import dump_json, print_table

PROBE = r"""
import json, sys, time, torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).eval()
x = torch.randn(4, 32)
if sys.argv[1] == "ours":
    from taylorattr.methods import DeepLift
    run = lambda: DeepLift(model).attribute(x, 0.0, target=0)
else:
    from captum.attr import DeepLift
    run = lambda: DeepLift(model).attribute(x, 0.0 * x, target=0)
t0 = time.perf_counter(); run(); t1 = time.perf_counter(); run(); t2 = time.perf_counter()
print(json.dumps({"first": t1 - t0, "second": t2 - t1}))
"""


def probe(who: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, who], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    repeats = 2 if args.quick else 5
    runs = {who: [probe(who) for _ in range(repeats)] for who in ("ours", "captum")}
    best = {who: {k: min(r[k] for r in rs) for k in ("first", "second")}
            for who, rs in runs.items()}
    rows = [("DeepLift first call", f"{best['ours']['first'] * 1e3:.1f}",
             f"{best['captum']['first'] * 1e3:.1f}",
             f"{best['ours']['first'] / best['captum']['first']:.2f}",
             f"{best['ours']['first'] / best['ours']['second']:.1f}")]
    print_table("First call in a fresh process (best of repeats)", rows,
                ("case", "ours ms", "captum ms", "ours/captum", "ours first/second"))
    dump_json(args.json, {"rows": [{"method": "deeplift_first_call", **best}]})


if __name__ == "__main__":
    main()
