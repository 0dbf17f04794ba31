"""Merge the finished units of an evaluation into one table.

Every unit file holds ``indices`` (the samples it scored, ascending), ``skipped``
(``[index, reason]`` of bad items) and ``scores[method][metric]`` (float64, one per
scored index). :func:`merge_units` concatenates them in unit order, i.e. in sample
order whatever the number of processes, and writes

* ``scores.csv``: one row per sample, method and metric (``index, method, metric,
  value``);
* ``summary.csv`` and ``summary.json``: per method and metric the count ``n``, the mean
  and its standard error ``sem = std(ddof=1) / sqrt(n)``
  (:func:`taylorattr.metrics.statistics.mean_sem`; NaN for one sample), NaN scores left out
  and counted in ``n_nan``; the JSON also lists the skipped items.

Floats are written with ``repr`` (shortest round-trip text), so equal numbers give equal
files, byte for byte.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ... import _io
from ...metrics.statistics import mean_sem

__all__ = ["merge_units"]


def _text(v: float) -> str:
    return repr(float(v))


def merge_units(units: list[dict], methods: list[str], metrics: list[str], out: Path) -> dict:
    """Write ``scores.csv``, ``summary.csv``, ``summary.json`` under ``out``; returns the
    summary dict."""
    indices = torch.cat([u["indices"].to(torch.long) for u in units]) if units \
        else torch.zeros(0, dtype=torch.long, device="cpu")
    skipped = [[int(i), str(r)] for u in units for i, r in u["skipped"]]
    rows, summary = [], []
    for m in methods:
        for k in metrics:
            v = torch.cat([u["scores"][m][k].to(torch.float64) for u in units]) if units \
                else torch.zeros(0, dtype=torch.float64, device="cpu")
            rows += [{"index": int(i), "method": m, "metric": k, "value": _text(s)}
                     for i, s in zip(indices.tolist(), v.tolist())]
            finite = v[~torch.isnan(v)]
            mean, sem = mean_sem(finite) if finite.numel() else (float("nan"), float("nan"))
            summary.append({"method": m, "metric": k, "n": int(finite.numel()),
                            "n_nan": int(v.numel() - finite.numel()),
                            "mean": _text(mean), "sem": _text(sem)})
    _io.save_csv(rows, out / "scores.csv", ["index", "method", "metric", "value"])
    _io.save_csv(summary, out / "summary.csv", ["method", "metric", "n", "n_nan", "mean", "sem"])
    result = {"summary": [{**s, "mean": float(s["mean"]), "sem": float(s["sem"])}
                          for s in summary],
              "n_scored": int(indices.numel()), "skipped": skipped}
    _io.save_json(result, out / "summary.json")
    return result
