"""``taylorattr evaluate``: attribute and score a whole dataset (torchrun-ready)."""
from __future__ import annotations

from ..arguments import _any_method, _dataset_flags, _output_dir, _positive_int, method_names
from ..jobs import dataset_job, dataset_stages, experiments, job_lines, plural, run_job
from ..preflight import check_writable

CHEAPER = ("fewer --samples, --methods or --metrics, a smaller --max-side or a larger "
           "--infidelity-scale, --device cuda, several processes (torchrun)")


def arguments(p, method_help: bool) -> None:
    _dataset_flags(p)
    p.add_argument("--methods", nargs="+", required=True, metavar="METHOD", type=_any_method,
                   help=f"registry names ({method_names(method_help)}) or labels, e.g. "
                        "gradient_input IG Occ-2x2")
    p.add_argument("--metrics", nargs="+", default=["infidelity"], choices=("infidelity", "bbox"),
                   help="metrics (bbox needs box masks)")
    p.add_argument("--max-side", type=_positive_int, default=10,
                   help="largest square side of the infidelity perturbations, in units of "
                        "--infidelity-scale")
    p.add_argument("--infidelity-scale", type=_positive_int, default=None, metavar="N",
                   help="infidelity squares of side N*(1..--max-side) on a grid of step N "
                        "(default: the image's shorter side // 28, as the assessment scales "
                        "its patches: 5,605 squares on 28x28 and on 224x224 alike; 1 is Yeh "
                        "et al.'s pixel level)")
    p.add_argument("--out", type=_output_dir, required=True, help="results folder")


def check(args) -> None:
    check_writable(args.out)


def stages(args) -> list:
    return dataset_stages(args, args.methods, "--methods", args.metrics, args.max_side,
                          args.infidelity_scale)


def run(args) -> str:
    evaluate, _, _ = experiments()
    model, dataset = dataset_job(args)
    scale = args.infidelity_scale or evaluate.infidelity_scale(
        evaluate.reference_shape(dataset, len(dataset)))
    report = run_job(lambda: evaluate.evaluate(
        model, dataset, args.methods, args.metrics, out=args.out, batch_size=args.batch_size,
        seed=args.seed, on_bad_item=args.bad_items, device=args.device, resume=args.resume,
        infidelity_options={"max_side": args.max_side, "scale": scale}, show_progress=True))
    if report.merged is None:
        return job_lines(report, "")
    rows = [f"{'method':<12} {'metric':<11} {'n':>6} {'mean':>14} {'sem':>12}"] + [
        f"{s['method']:<12} {s['metric']:<11} {s['n']:>6} {s['mean']:>14.6g} {s['sem']:>12.4g}"
        for s in report.merged["summary"]]
    skipped = report.merged["skipped"]
    if skipped:
        rows.append(f"skipped {plural(len(skipped), 'item')}: " + ", ".join(
            f"{i} ({r})" for i, r in skipped[:5]) + (" ..." if len(skipped) > 5 else ""))
    rows.append(f"Tables written to {args.out} (summary.csv, summary.json, scores.csv)")
    return job_lines(report, "\n".join(rows))
