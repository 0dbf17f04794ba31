"""Dataset-scale attribution and evaluation, on one process or under ``torchrun``.

:func:`evaluate` scores every sample of a dataset: for each method ``m`` and sample
``(x_i, t_i[, M_i])`` it computes the attribution ``a_i = m(f, x_i, x~, t_i)`` relative
to the point baseline ``x~`` (delta = x - x~) and the metrics

* ``infidelity``: :func:`taylorattr.metrics.infidelity`
  ``(1/N) sum_k (beta sum_j a_ij I_kj - (f_t(x_i) - f_t(x_i,k)))^2`` over Yeh et al.'s
  square removals (squares set to ``x~``), or Gaussian draws;
* ``bbox``: :func:`taylorattr.metrics.bbox_accuracy` ``|top_n(r_i) ∩ M_i| / n`` with the
  item's box mask ``M_i``;

and writes one table: ``summary.csv`` / ``summary.json`` (mean and standard error per
method and metric) and ``scores.csv`` (every score), see :mod:`.evaluation.merge`.
:func:`attribute_dataset` only writes the maps, one ``.pt`` per sample (PNG previews
on request).

Scale: the samples are cut into fixed units of ``batch_size`` (:mod:`.evaluation.sharding`)
dealt round-robin to the ranks of a ``torchrun`` job (gloo on CPU, NCCL on GPU,
:mod:`taylorattr.runtime.distributed`); sample ``i``'s random draws (Expected Gradients' baselines,
Gaussian infidelity) are seeded with ``sample_seed(seed, i)``; so for a given
``batch_size`` every number is the same whatever the world size (bitwise, with the same
device type and thread count). Each finished unit is a file written atomically; a rerun
(any world size) computes only the missing units; a lock with host and pid refuses a
second job on the same ``out`` (:mod:`.evaluation.lock`). Bad dataset items
(:mod:`.evaluation.items`) are refused (``on_bad_item="refuse"``, the default: a
``ValueError`` naming the index) or skipped and listed (``"skip"``).
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

import torch

from .. import _io
from .. import registry as _registry
from .._validation import check_positive_int, check_seed
from ..metrics import bbox_accuracy, infidelity
from ._units import model_fingerprint
from .evaluation.items import BadItem, read_item, reference_shape
from .evaluation.job import JobReport, run_job
from .evaluation.merge import merge_units
from .evaluation.sharding import sample_seed

__all__ = ["METRICS", "JobReport", "attribute_dataset", "evaluate", "resolve_methods"]

#: The metrics :func:`evaluate` computes.
METRICS = ("infidelity", "bbox")
_BAD_ITEM = ("refuse", "skip")
_INFIDELITY_OPTIONS = {"perturbation", "max_side", "n_perturb_samples", "noise_std",
                       "batch_size", "normalize"}


def resolve_methods(methods) -> list[_registry.BoundMethod]:
    """Bound methods from registry names (``"integrated_gradients"``, its default
    setting), variant labels in any case (``"IG"``, ``"ig"``, ``"Occ-4x4"``) or
    :class:`~taylorattr.registry.BoundMethod` objects (:func:`taylorattr.registry.resolve`)."""
    if isinstance(methods, (str, _registry.BoundMethod)):
        methods = [methods]
    if not isinstance(methods, Sequence) or not methods:
        raise TypeError("methods must be a non-empty list of method names, labels or bound "
                        f"methods, got {methods!r}")
    out = [_registry.resolve(m) for m in methods]
    labels = [b.label for b in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"methods: each method may appear once, got labels {labels}")
    return out


def _attribute(bound, model, x, targets, baseline, indices, seed):
    """Attributions of a batch; a method with a ``seed`` runs per sample with its seed."""
    if "seed" not in bound.spec.options():
        return bound(model, x, baseline, targets).detach()
    rows = []
    for j, i in enumerate(indices):
        own = dataclasses.replace(bound, settings=MappingProxyType(
            {**bound.settings, "seed": sample_seed(seed, i)}))
        rows.append(own(model, x[j:j + 1], baseline, targets[j:j + 1]).detach())
    return torch.cat(rows)


def _read_unit(dataset, indices, shape, need_mask, on_bad_item):
    items, skipped = [], []
    for i in indices:
        try:
            items.append(read_item(dataset, i, shape, need_mask))
        except BadItem as exc:
            if on_bad_item == "refuse":
                raise ValueError(f"{exc}; fix it or pass on_bad_item='skip' "
                                 "(--bad-items skip) to leave it out") from None
            warnings.warn(f"skipped {exc}", RuntimeWarning, stacklevel=2)
            skipped.append([i, exc.reason])
    return items, skipped


def _batch(items, model, device):
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    x = torch.stack([it.input for it in items]).to(device=device, dtype=dtype)
    t = torch.tensor([it.target for it in items], device=device)
    masks = None if items[0].mask is None else torch.stack([it.mask for it in items]).to(device)
    return x, t, masks


def _common(model, dataset, batch_size, seed, on_bad_item, baseline, device):
    if not callable(model) or not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise TypeError("dataset must be a map-style dataset (len and dataset[i]), got "
                        f"{type(dataset).__name__}")
    check_positive_int(batch_size, "batch_size")
    check_seed(seed)
    if on_bad_item not in _BAD_ITEM:
        raise ValueError(f"on_bad_item must be one of {_BAD_ITEM}, got {on_bad_item!r}")
    if isinstance(baseline, bool) or not isinstance(baseline, (int, float)):
        raise TypeError(f"baseline must be a number (the point baseline), got {baseline!r}")
    n = len(dataset)
    if n < 1:
        raise ValueError("dataset is empty")
    dev = torch.device(device) if device is not None else None
    return n, dev


def _config(model, n, methods, batch_size, seed, on_bad_item, baseline, shape, **extra):
    return {"model": model_fingerprint(model), "n_samples": n, "batch_size": batch_size,
            "seed": seed, "on_bad_item": on_bad_item, "baseline": float(baseline),
            "input_shape": list(shape),
            "methods": [[b.label, b.name, b.tag()] for b in methods], **extra}


def evaluate(model, dataset, methods, metrics=("infidelity",), *, out, batch_size: int = 16,
             seed: int = 0, baseline: float = 0.0, on_bad_item: str = "refuse",
             infidelity_options: Mapping | None = None, input_shape=None,
             device=None) -> JobReport:
    """Attribute and score every sample of ``dataset`` (see the module docstring).

    Args:
        model: classifier ``[B, ...] -> [B, classes]`` (moved to this rank's device).
        dataset: map-style, items ``(input, target[, box_mask])``.
        methods: registry names, labels (any case) or bound methods.
        metrics: any of ``"infidelity"``, ``"bbox"`` (needs box masks).
        out: output folder: ``manifest.json``, ``units/``, the merged ``summary.csv``,
            ``summary.json`` and ``scores.csv``.
        batch_size: samples per unit (one batch); part of the job's identity.
        seed: base of the per-sample seeds.
        baseline: the point baseline ``x~`` (also the square-removal value).
        on_bad_item: ``"refuse"`` (ValueError naming the item) or ``"skip"`` (warn, list
            it in ``summary.json``).
        infidelity_options: passed to :func:`taylorattr.metrics.infidelity`
            (``max_side``, ``perturbation``, ``n_perturb_samples``, ``noise_std``,
            ``batch_size``, ``normalize``).
        input_shape: the expected input shape (default: the first readable item's).
        device: force a device (default ``cuda:LOCAL_RANK`` if CUDA is available).

    Returns:
        This process's :class:`JobReport`; ``merged`` (rank 0) is the summary dict.
    """
    n, dev = _common(model, dataset, batch_size, seed, on_bad_item, baseline, device)
    bound = resolve_methods(methods)
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    bad = [m for m in metrics if m not in METRICS]
    if bad or not metrics:
        raise ValueError(f"metrics must be a non-empty list of {list(METRICS)}, got {metrics}")
    opts = dict(infidelity_options or {})
    if set(opts) - _INFIDELITY_OPTIONS:
        raise ValueError(f"infidelity_options: unknown option(s) {sorted(set(opts) - _INFIDELITY_OPTIONS)}"
                         f"; it takes {sorted(_INFIDELITY_OPTIONS)}")
    square = opts.get("perturbation", "square") == "square"
    shape = tuple(input_shape) if input_shape is not None else reference_shape(dataset, n)
    need_mask = "bbox" in metrics
    config = _config(model, n, bound, batch_size, seed, on_bad_item, baseline, shape,
                     kind="evaluate", metrics=metrics, infidelity=opts)

    def compute(indices: range) -> dict:
        device = dev or _model_device(model)
        items, skipped = _read_unit(dataset, indices, shape, need_mask, on_bad_item)
        scores = {b.label: {k: torch.zeros(0, dtype=torch.float64) for k in metrics}
                  for b in bound}
        if items:
            x, t, masks = _batch(items, model, device)
            idx = [it.index for it in items]
            for b in bound:
                a = _attribute(b, model, x, t, baseline, idx, seed)
                if "infidelity" in metrics:
                    if square:
                        s = infidelity(model, x, a, t, baselines=baseline, **opts)
                    else:
                        s = torch.cat([infidelity(model, x[j:j + 1], a[j:j + 1], t[j:j + 1],
                                                  seed=sample_seed(seed, i), **opts)
                                       for j, i in enumerate(idx)])
                    scores[b.label]["infidelity"] = s.detach().to("cpu", torch.float64)
                if "bbox" in metrics:
                    scores[b.label]["bbox"] = bbox_accuracy(a, masks).to("cpu", torch.float64)
        return {"indices": torch.tensor([it.index for it in items], dtype=torch.long),
                "skipped": skipped, "scores": scores}

    model = _prepare(model, dev)
    return run_job(Path(out), config, n, batch_size, compute,
                   lambda units: merge_units(units, [b.label for b in bound], metrics, Path(out)),
                   device=dev)


def _model_device(model):
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _prepare(model, dev):
    from ..runtime import distributed

    if dev is None:
        _, _, local = distributed.env_world()
        dev = torch.device(f"cuda:{local}") if torch.cuda.is_available() else torch.device("cpu")
    return model.to(dev).eval()


def attribute_dataset(model, dataset, method, *, out, batch_size: int = 16, seed: int = 0,
                      baseline: float = 0.0, on_bad_item: str = "refuse", previews: bool = False,
                      input_shape=None, device=None) -> JobReport:
    """Attributions of every sample, saved as ``out/maps/<index:06d>.pt`` (a dict with
    ``attribution``, ``index``, ``target``, ``method``) and, with ``previews``, a PNG
    ``out/previews/<index:06d>.png`` (channel-summed map, red positive, blue negative,
    symmetric scale). Same sharding, seeds, lock, resume and bad-item handling as
    :func:`evaluate`; ``summary.json`` lists what was written and skipped."""
    n, dev = _common(model, dataset, batch_size, seed, on_bad_item, baseline, device)
    (bound,) = resolve_methods([method] if not isinstance(method, list) else method)
    if not isinstance(previews, bool):
        raise TypeError(f"previews must be a bool, got {type(previews).__name__}")
    shape = tuple(input_shape) if input_shape is not None else reference_shape(dataset, n)
    config = _config(model, n, [bound], batch_size, seed, on_bad_item, baseline, shape,
                     kind="attribute", previews=previews)
    out = Path(out)

    def compute(indices: range) -> dict:
        device = dev or _model_device(model)
        items, skipped = _read_unit(dataset, indices, shape, False, on_bad_item)
        if items:
            x, t, _ = _batch(items, model, device)
            a = _attribute(bound, model, x, t, baseline, [it.index for it in items], seed).cpu()
            for j, it in enumerate(items):
                _io.save_tensors({"attribution": a[j].clone(), "index": it.index,
                                  "target": it.target, "method": bound.label},
                                 out / "maps" / f"{it.index:06d}.pt")
                if previews:
                    _preview(a[j], out / "previews" / f"{it.index:06d}.png")
        return {"indices": torch.tensor([it.index for it in items], dtype=torch.long),
                "skipped": skipped}

    def merge(units):
        result = {"method": bound.label, "n_written": int(sum(u["indices"].numel() for u in units)),
                  "skipped": [[int(i), str(r)] for u in units for i, r in u["skipped"]],
                  "maps": "maps/<index:06d>.pt"}
        _io.save_json(result, out / "summary.json")
        return result

    model = _prepare(model, dev)
    return run_job(out, config, n, batch_size, compute, merge, device=dev)


def _preview(attribution: torch.Tensor, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = attribution.to(torch.float64)
    m = m.sum(0) if m.dim() == 3 else m.reshape(m.shape[-2:]) if m.dim() >= 2 else m[None]
    scale = float(m.abs().max()) or 1.0
    with _io.atomic_path(path) as tmp:
        plt.imsave(tmp, m.numpy(), cmap="bwr", vmin=-scale, vmax=scale, format="png")
