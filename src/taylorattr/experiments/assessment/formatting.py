"""Markdown for the assessment's tables (data in, text out; nothing is computed here)."""
from __future__ import annotations

import math

from ...reporting.report import markdown_table
from .. import paper
from .localisation import MAX_MASK_COVERAGE

__all__ = ["format_assessment"]


def _fmt(v, spec=".4g") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return format(v, spec)


def _trend_table(rows: list[dict], metric: str, sem: str) -> list[str]:
    models = list(dict.fromkeys(r["model"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    look = {(r["model"], r["method"]): r for r in rows}
    head = ["method", "principles (measured)", "principles (paper)"] + models
    body = []
    for meth in methods:
        first = next(r for r in rows if r["method"] == meth)
        cells = [meth, _fmt(first["principles"], "g"), _fmt(first["principles_paper"], "g")]
        for m in models:
            r = look.get((m, meth))
            if r is None or r[metric] is None:
                cells.append("unsupported" if r is not None and r.get("note") else "")
            else:
                cells.append(f"{r[metric]:.4g} ± {_fmt(r[sem], '.2g')}")
        body.append(cells)
    return [markdown_table(head, body)]


def _correlation_table(result, experiment: str) -> list[str]:
    rows = [r for r in result.correlations if r["experiment"] == experiment]
    if not rows:
        return []
    sign = paper.CORRELATION_SIGN[experiment]
    lines = ["", f"Spearman rank correlation with the number of principles (paper: {sign}):", "",
             markdown_table(["model", "measured counts", "paper's counts",
                             "measured, point baselines only", "methods"],
                            [[r["model"], _fmt(r["spearman"], ".3f"),
                              _fmt(r["spearman_paper_counts"], ".3f"),
                              _fmt(r.get("spearman_point_baselines"), ".3f"), r["n_methods"]]
                             for r in rows])]
    lines += ["", ("Point baselines only: methods whose references are drawn from a "
                   "distribution (noise around the input, say) explain f(x) - E f(x~), not "
                   "the removal to 0 that the square perturbations test.")]
    return lines


def _imagenet_note(info: dict) -> str:
    """One line: the ImageNet route's patch scale, its rows per image, the GPU-scale ones."""
    scale, crop = info["patch_scale"], info.get("crop", "?")
    text = (f"ImageNet route: patch scale {scale} ({info['patch_scale_source']}): every "
            f"window/player setting x{scale}"
            + (" (the paper's pixel level)" if scale == 1 else
               f", so each covers the share of the {crop}x{crop} image it covers on 28x28 MNIST")
            + "; rows per image: "
            + ", ".join(f"{k} {v:,}" for k, v in info["rows_per_image"].items()) + ".")
    if info["gpu_scale"]:
        text += (f" GPU-scale on {info['device']}: {', '.join(info['gpu_scale'])} (use a "
                 "coarser --imagenet-patch-scale or a GPU).")
    return text


def format_assessment(result) -> str:
    """Markdown: each experiment's table beside the paper's claims."""
    s = result.settings
    lines: list[str] = []
    if result.principles:
        lines += ["### Principles followed (x-axis)", "",
                  ("Count = #follows + 0.5 x #partially, from the measured verdicts "
                   f"({s.get('principle_counts_source', '')})."), "",
                  markdown_table(["method", "principle 1", "principle 2", "principle 3", "count",
                                  "paper's count"],
                                 [[r["method"], *(r.get(f"verdict_{p}", "") for p in (1, 2, 3)),
                                   _fmt(r["principles"], "g"), _fmt(r.get("principles_paper"), "g")]
                                  for r in result.principles]), ""]
    if result.infidelity:
        n = result.settings.get("samples", {}).get("infidelity")
        lines += ["### Infidelity vs principles (paper Figure 3)", "",
                  ("Square removal (sides 1..10, baseline 0), optimal beta, predicted-class "
                   f"logit; mean ± standard error over {n} held-out MNIST digits. Lower is "
                   "better. Occ-2x2 is Occlusion-patch with 2x2 windows."), ""]
        lines += _trend_table(result.infidelity, "infidelity", "infidelity_sem")
        lines += _correlation_table(result, "infidelity")
        lines.append("")
    if result.taylor_order:
        n = result.settings.get("samples", {}).get("taylor_order")
        lines += ["### Infidelity of first- vs second-order Taylor attribution", "",
                  f"Baseline 0, predicted-class logit, {n} held-out digits. The paper: "
                  "second order lower (better) on both models. Our infidelity is in squared "
                  "logit units, the paper's scale is not stated, so compare directions. "
                  "Paper: " + "; ".join(f"{m} {d[1]} (first) vs {d[2]} (second)"
                                        for m, d in paper.TAYLOR_ORDER.items()) + ".", "",
                  markdown_table(["model", "order", "infidelity", "paper"], [
                      [r["model"], r["order"], None if r["infidelity"] is None else
                       f"{r['infidelity']:.4g} ± {_fmt(r['infidelity_sem'], '.2g')}",
                       _fmt(r["paper"], "g")] for r in result.taylor_order])]
        means = {(r["model"], r["order"]): r["infidelity"] for r in result.taylor_order}
        for t in result.taylor_tests:
            m, k, j = t["model"], t["order"], t["against"]
            lines.append(f"\n{m}: order-{k} infidelity vs order-{j}: {t['statement']} "
                         f"({t['test']}; means {_fmt(means.get((m, k)))} vs "
                         f"{_fmt(means.get((m, j)))}; paper: second order lower).")
        lines.append("")
    if result.bbox:
        n = result.settings.get("samples", {}).get("bbox")
        excl = {r["model"]: r["n_excluded"] for r in result.bbox}
        lines += ["### Bounding-box accuracy vs principles (paper Figure 4)", "",
                  f"Up to {n} held-out images per model whose box covers at most "
                  f"{MAX_MASK_COVERAGE:.0%} of the image (excluded: "
                  + ", ".join(f"{m} {k}" for m, k in excl.items()) + f"); target: "
                  f"{s.get('bbox_target', 'predicted')} class. Higher is better.", ""]
        lines += _trend_table(result.bbox, "bbox_accuracy", "bbox_accuracy_sem")
        if s.get("imagenet"):
            lines += ["", _imagenet_note(s["imagenet"])]
        notes = {}
        for r in result.bbox:
            if r.get("note"):
                notes.setdefault(" ".join(r["note"].splitlines()[:2])[:240], []).append(
                    f"{r['method']} on {r['model']}")
        for note, where in notes.items():
            lines.append(f"\n{', '.join(where)}: {note}")
        lines += _correlation_table(result, "bbox")
        lines.append("")
    if result.models:
        acc = ", ".join(f"{m['model']} {100 * m['held_out_accuracy']:.1f}%"
                        for m in result.models if m.get("held_out_accuracy") is not None)
        if acc:
            lines.append(f"Held-out accuracy of the models: {acc}.")
    if result.timings:
        lines.append("Timings: " + ", ".join(f"{k} {v}" for k, v in result.timings.items()) + ".")
    return "\n".join(lines)
