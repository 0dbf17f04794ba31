"""One handler per command: call the library, return the text to print."""
from __future__ import annotations

import sys

from .arguments import CliError, _one_line
from .jobs import dataset_job


def _validate(args) -> str:
    from ..experiments.validation import format_study, run_validation_study
    from ..experiments.workspace import Workspace

    presets = list(dict.fromkeys(args.preset))
    seeds = tuple(range(args.seed, args.seed + (args.seeds or 1)))
    ws = Workspace(args.out, seed=args.seed, quick=args.quick, mnist_dir=args.mnist_dir,
                   training=presets[0], seeds=seeds)
    study = run_validation_study(ws, presets=presets, models=tuple(args.models),
                                 orders=tuple(args.order), n_samples=args.samples)
    return format_study(study) + f"\n\nTables written to {args.out / 'validation'}"


def _principles(args) -> str:
    from ..principles import format_table, principles_table

    return format_table(principles_table(seed=args.seed))


def _assess(args) -> str:
    from ..experiments.assessment import ImagenetRoute, format_assessment, run_assessment
    from ..experiments.workspace import Workspace

    ws = Workspace(args.out, seed=args.seed, quick=not args.full, mnist_dir=args.mnist_dir,
                   training=args.preset)
    route = None if args.imagenet_dir is None else ImagenetRoute(
        args.imagenet_dir, dict(args.weights), patch_scale=args.imagenet_patch_scale)
    result = run_assessment(ws, experiments=tuple(args.experiment), n_samples=args.samples,
                            imagenet=route, method_kwargs=ws.method_kwargs("assessment") or None)
    return format_assessment(result) + f"\n\nTables and figures written to {args.out / 'assessment'}"


def _reproduce(args) -> str:
    from ..experiments.reproduce import reproduce

    report = reproduce(args.out, full=args.full, mnist_dir=args.mnist_dir, seed=args.seed,
                       presets=list(dict.fromkeys(args.preset)), seeds=args.seeds)
    return f"Report: {report}\n        {report.with_suffix('.html')}"


def _explain(args) -> str:
    from ..experiments.explain import explain

    network = getattr(args, "network", None)  # built by the estimate, when it ran
    result = explain(args.image, model=args.model if network is None else network,
                     weights=args.weights, methods=args.methods, target=args.target,
                     out_dir=args.out, sign=args.sign, overlay=args.overlay,
                     save_maps=args.save_maps, beta=None if args.beta == 0 else args.beta,
                     interactions=args.interactions,
                     show_progress=sys.stderr.isatty())  # bars on a terminal, not in logs
    for line in result.warnings:
        print(f"taylorattr explain: warning: {_one_line(line)}", file=sys.stderr)
    lines = ["top-5 classes:"] + [
        f"  {p:6.2%}  {i:4d} {label}" + ("  <- explained" if i == result.target else "")
        for (label, p), i in zip(result.top5, result.top5_indices)]
    if result.target not in result.top5_indices:
        lines.append(f"explained class: {result.target} (p = {result.probability:.3g}, chosen)")
    lines.append(f"saliency figure: {result.figure}")
    lines.append(f"warnings: {result.warnings_file}")
    if result.interactions_figure is not None:
        lines.append(f"interactions: {result.interactions_figure}")
    if result.map_files:
        lines.append(f"maps: {result.map_files[0].parent} ({len(result.map_files)} files)")
    return "\n".join(lines)


def _job_lines(report, what: str) -> str:
    line = (f"rank {report.rank}/{report.world_size}: {report.computed} units computed, "
            f"{report.reused} reused")
    if report.stale_lock:
        line += (f"; took over the stale lock of pid {report.stale_lock['pid']} on "
                 f"{report.stale_lock['host']}")
    return line if report.merged is None else f"{what}\n{line}"


def _evaluate(args) -> str:
    from ..experiments.evaluate import evaluate
    from ..experiments.evaluation.lock import LockHeld

    model, dataset = getattr(args, "job", None) or dataset_job(args)
    try:
        report = evaluate(model, dataset, args.methods, args.metrics, out=args.out,
                          batch_size=args.batch_size, seed=args.seed,
                          on_bad_item=args.bad_items, device=args.device,
                          infidelity_options={"max_side": args.max_side})
    except LockHeld as exc:
        raise CliError("--out", str(exc)) from None
    if report.merged is None:
        return _job_lines(report, "")
    rows = [f"{'method':<12} {'metric':<11} {'n':>6} {'mean':>14} {'sem':>12}"] + [
        f"{s['method']:<12} {s['metric']:<11} {s['n']:>6} {s['mean']:>14.6g} {s['sem']:>12.4g}"
        for s in report.merged["summary"]]
    skipped = report.merged["skipped"]
    if skipped:
        rows.append(f"skipped {len(skipped)} item(s): " + ", ".join(
            f"{i} ({r})" for i, r in skipped[:5]) + (" ..." if len(skipped) > 5 else ""))
    rows.append(f"Tables written to {args.out} (summary.csv, summary.json, scores.csv)")
    return _job_lines(report, "\n".join(rows))


def _attribute(args) -> str:
    from ..experiments.evaluate import attribute_dataset
    from ..experiments.evaluation.lock import LockHeld

    model, dataset = getattr(args, "job", None) or dataset_job(args)
    try:
        report = attribute_dataset(model, dataset, args.method, out=args.out,
                                   batch_size=args.batch_size, seed=args.seed,
                                   on_bad_item=args.bad_items, previews=args.previews,
                                   device=args.device)
    except LockHeld as exc:
        raise CliError("--out", str(exc)) from None
    if report.merged is None:
        return _job_lines(report, "")
    m = report.merged
    text = (f"{m['n_written']} maps ({m['method']}) written to {args.out / 'maps'}"
            + (f"; skipped {len(m['skipped'])}: " + ", ".join(f"{i} ({r})" for i, r in m['skipped'][:5])
               if m["skipped"] else ""))
    return _job_lines(report, text)


COMMANDS = {"validate": _validate, "principles": _principles, "assess": _assess,
            "reproduce": _reproduce, "explain": _explain}
COMMANDS.update(evaluate=_evaluate, attribute=_attribute)
