"""``taylorattr attribute``: attributions of a whole dataset, one map per input."""
from __future__ import annotations

from ..arguments import MAP_FORMATS, _any_method, _dataset_flags, _output_dir, method_names
from ..jobs import dataset_job, dataset_stages, experiments, job_lines, plural, run_job
from ..preflight import check_writable

CHEAPER = "fewer --samples, a cheaper --methods, --device cuda, several processes (torchrun)"


def arguments(p, method_help: bool) -> None:
    _dataset_flags(p)
    p.add_argument("--methods", "--method", dest="methods", nargs="+", required=True,
                   type=_any_method, metavar="METHOD",
                   help="the method whose maps are written: a registry name "
                        f"({method_names(method_help)}) or a label such as IG, Occ-2x2 "
                        "(--method is the same flag)")
    p.add_argument("--previews", action="store_true",
                   help="also write a PNG beside each map (<map>.preview.png)")
    p.add_argument("--format", choices=MAP_FORMATS, default="pt",
                   help="file format of each map (png: the channel-summed map as a picture)")
    p.add_argument("--out", type=_output_dir, required=True,
                   help="output folder: each map at its image's path relative to --data "
                        "(cat/a.jpg.pt), index.csv, summary.json")


def argument_errors(args) -> str | None:
    if len(args.methods) > 1:
        return (f"--methods: attribute writes one map per input, so it takes one method, got "
                f"{len(args.methods)} ({' '.join(args.methods)}); run it once per method "
                "with its own --out, or use evaluate for several")
    args.method = args.methods[0]
    return None


def check(args) -> None:
    check_writable(args.out)


def stages(args) -> list:
    return dataset_stages(args, [args.method], "--methods")


def run(args) -> str:
    evaluate, _, _ = experiments()
    model, dataset = dataset_job(args)
    report = run_job(lambda: evaluate.attribute_dataset(
        model, dataset, args.method, out=args.out, batch_size=args.batch_size, seed=args.seed,
        on_bad_item=args.bad_items, previews=args.previews, device=args.device,
        resume=args.resume, map_format=args.format, show_progress=True))
    if report.merged is None:
        return job_lines(report, "")
    m = report.merged
    text = (f"{plural(m['n_written'], 'map')} ({m['method']}) written to {args.out}, listed "
            f"with their inputs in {args.out / 'index.csv'}"
            + (f"; skipped {len(m['skipped'])}: " + ", ".join(f"{i} ({r})" for i, r in m['skipped'][:5])
               if m["skipped"] else ""))
    return job_lines(report, text)
