"""Principle counts (the x-axis of Figures 3 and 4) and their rank correlations.

    count = #"follows" + 0.5 * #"partially"     over the three principles

from the verdicts the audit *measures* (:func:`taylorattr.principles.principles_table`);
the paper's own counts (from its Table 2, in each method's registry row) are kept beside
them as a labelled reference, never as the measured numbers.
"""
from __future__ import annotations

import hashlib
import inspect
import math

from ... import principles
from ...methods import UnsupportedModelError
from ...metrics.statistics import spearman
from ...paper_methods import paper_facts, principle_count
from .. import paper
from .._units import UnitStore

__all__ = ["correlation_rows", "measured_principle_counts", "principle_rows"]


def principle_rows(methods, seed: int) -> list[dict]:
    """One audited row per bound method: verdicts, scores, measured and paper counts."""

    audited = {}
    for name in dict.fromkeys(m.name for m in methods):
        try:
            audited.update({r["method"]: r for r in principles.principles_table(
                methods=[name], seed=seed)})
        except UnsupportedModelError as exc:  # e.g. Grad-CAM: the probes have no convolution
            audited[name] = {"error": f"not audited: {str(exc).splitlines()[0]}"}
    out = []
    for m in methods:
        r = audited[m.name]
        if "error" in r:
            out.append({"method": m.label, "registry": m.name,
                        **{f"verdict_{p}": "n/a" for p in (1, 2, 3)},
                        **{f"score_{p}": None for p in (1, 2, 3)},
                        "principles": None, "principles_paper": _paper_count(m),
                        "note": r["error"]})
            continue
        verdicts = [r[f"verdict_{p}"] for p in (1, 2, 3)]
        out.append({"method": m.label, "registry": m.name,
                    **{f"verdict_{p}": verdicts[p - 1] for p in (1, 2, 3)},
                    **{f"score_{p}": float(r[f"score_{p}"]) for p in (1, 2, 3)},
                    "principles": principle_count(verdicts),
                    "principles_paper": _paper_count(m)})
    return out


def _paper_count(method) -> float | None:
    facts = paper_facts(method.name)
    return None if facts is None else facts.principle_count


def _source_fingerprint() -> str:
    """A hash of the principles package's source, so cached audits follow code changes."""
    try:
        text = "".join(inspect.getsource(m) for m in (principles.probes, principles.measures,
                                                       principles.auditing))
    except (OSError, TypeError):  # pragma: no cover - no source shipped
        return "nosource"
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def measured_principle_counts(methods, seed: int = 0, store: UnitStore | None = None
                              ) -> tuple[dict[str, float], list[dict]]:
    """The number of principles each bound method follows, as the audit measures it.

    Returns ``(counts, rows)``: ``counts[label]`` and one row per method (verdicts, scores,
    count, the paper's count). With ``store`` the audit is a unit keyed by the seed, the
    methods and a hash of the principles package's source.
    """
    if store is None:
        rows = principle_rows(methods, seed)
    else:
        tag = "-".join(f"{m.name}:{m.tag()}" for m in methods)
        key = f"principles-seed{seed}-src{_source_fingerprint()}-" + \
            hashlib.sha1(tag.encode()).hexdigest()[:10]
        rows = store.get(key, lambda: {"rows": principle_rows(methods, seed)})["rows"]
    return {r["method"]: (None if r["principles"] is None else float(r["principles"]))
            for r in rows}, rows


def correlation_rows(rows: list[dict], experiment: str, metric: str, point_labels) -> list[dict]:
    """Per model: Spearman's rank correlation of ``metric`` with the measured counts, with
    the paper's counts, and with the measured counts over the methods in ``point_labels``
    only (those that explain the change to the same point baseline the metric removes to)."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        valid = [r for r in rows if r["model"] == model and r[metric] is not None
                 and math.isfinite(r[metric]) and r["principles"] is not None]
        points = [r for r in valid if r["method"] in point_labels]
        paired = [r for r in valid if r["principles_paper"] is not None]
        out.append({"experiment": experiment, "model": model, "metric": metric,
                    "spearman": spearman([r["principles"] for r in valid],
                                         [r[metric] for r in valid]),
                    "spearman_point_baselines": spearman([r["principles"] for r in points],
                                                         [r[metric] for r in points]),
                    "spearman_paper_counts": spearman([r["principles_paper"] for r in paired],
                                                      [r[metric] for r in paired]),
                    "n_methods": len(valid), "paper_sign": paper.CORRELATION_SIGN[experiment]})
    return out
