"""One handler per command: call the library, return the text to print."""
from __future__ import annotations

import sys

from .arguments import CliError, _one_line
from .jobs import dataset_job, explain_network


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

    result = explain(args.image, model=explain_network(args), methods=args.methods,
                     target=args.target, out_dir=args.out, sign=args.sign,
                     overlay=args.overlay, save_maps=args.save_maps,
                     beta=None if args.beta == 0 else args.beta,
                     interactions=args.interactions, map_formats=tuple(args.format),
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


def _plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _job_lines(report, what: str) -> str:
    """``what`` and the items this process computed and reused ("rank r/W: " in front
    under torchrun only), with what changed for the recomputed ones."""
    from ..experiments.evaluate import describe_changes

    line = f"{_plural(report.computed, 'item')} computed, {report.reused:,} reused"
    if report.world_size > 1:
        line = f"rank {report.rank}/{report.world_size}: {line}"
    changes = describe_changes(report)
    if changes:
        n = report.recomputed
        line += (f" ({n:,} recomputed because what {'it was' if n == 1 else 'they were'} "
                 f"computed from changed: {changes})")
    if report.stale_lock:
        line += (f"; took over the stale lock of pid {report.stale_lock['pid']} on "
                 f"{report.stale_lock['host']}")
    return line if report.merged is None else f"{what}\n{line}"


def _run_job(run):
    """Run a dataset job; its expected failures named by their flags. Its items are one
    stage (``show_progress=True``: a bar on a terminal, lines in a log,
    :func:`taylorattr.runtime.progress.stage`)."""
    from ..experiments.evaluation.lock import LockHeld

    try:
        return run()
    except LockHeld as exc:
        raise CliError("--out", str(exc)) from None


def _evaluate(args) -> str:
    from ..experiments.evaluate import evaluate, infidelity_scale
    from ..experiments.evaluation.items import reference_shape

    model, dataset = dataset_job(args)
    scale = args.infidelity_scale or infidelity_scale(reference_shape(dataset, len(dataset)))
    report = _run_job(lambda: evaluate(
        model, dataset, args.methods, args.metrics, out=args.out, batch_size=args.batch_size,
        seed=args.seed, on_bad_item=args.bad_items, device=args.device, resume=args.resume,
        infidelity_options={"max_side": args.max_side, "scale": scale}, show_progress=True))
    if report.merged is None:
        return _job_lines(report, "")
    rows = [f"{'method':<12} {'metric':<11} {'n':>6} {'mean':>14} {'sem':>12}"] + [
        f"{s['method']:<12} {s['metric']:<11} {s['n']:>6} {s['mean']:>14.6g} {s['sem']:>12.4g}"
        for s in report.merged["summary"]]
    skipped = report.merged["skipped"]
    if skipped:
        rows.append(f"skipped {_plural(len(skipped), 'item')}: " + ", ".join(
            f"{i} ({r})" for i, r in skipped[:5]) + (" ..." if len(skipped) > 5 else ""))
    rows.append(f"Tables written to {args.out} (summary.csv, summary.json, scores.csv)")
    return _job_lines(report, "\n".join(rows))


def _attribute(args) -> str:
    from ..experiments.evaluate import attribute_dataset

    model, dataset = dataset_job(args)
    report = _run_job(lambda: attribute_dataset(
        model, dataset, args.method, out=args.out, batch_size=args.batch_size, seed=args.seed,
        on_bad_item=args.bad_items, previews=args.previews, device=args.device,
        resume=args.resume, map_format=args.format, show_progress=True))
    if report.merged is None:
        return _job_lines(report, "")
    m = report.merged
    text = (f"{_plural(m['n_written'], 'map')} ({m['method']}) written to {args.out}, listed "
            f"with their inputs in {args.out / 'index.csv'}"
            + (f"; skipped {len(m['skipped'])}: " + ", ".join(f"{i} ({r})" for i, r in m['skipped'][:5])
               if m["skipped"] else ""))
    return _job_lines(report, text)


COMMANDS = {"validate": _validate, "principles": _principles, "assess": _assess,
            "reproduce": _reproduce, "explain": _explain}
COMMANDS.update(evaluate=_evaluate, attribute=_attribute)
