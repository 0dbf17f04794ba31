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
device type and thread count). Each finished unit is a file written atomically, with
each item's result keyed by the fingerprint of what it was computed from
(:mod:`.fingerprints`: the model, the item's input, the methods, the seed, the version);
a rerun (any world size) computes, per item, the missing results and those whose
fingerprint changed (a unit's such items as one batch), and says what changed
(``resume="strict"`` refuses instead); a lock with host and pid refuses a second job on
the same ``out`` (:mod:`.evaluation.lock`). Bad dataset items (:mod:`.evaluation.items`)
are refused (``on_bad_item="refuse"``, the default: a ``ValueError`` naming the index) or
skipped and listed (``"skip"``); an item whose target is ``PREDICTED`` explains the
model's top class. :class:`DatasetStage` counts the rows of both jobs before they run.

Why one module: :func:`evaluate`, :func:`attribute_dataset` and :class:`DatasetStage`
share the reading, batching, seeding and fingerprinting of the items; apart, each would
copy them.
"""
from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import torch

from .. import _io
from .. import registry as _registry
from .._validation import check_positive_int, check_real, check_seed
from ..metrics import bbox_accuracy, infidelity, infidelity_cost
from ..models import model_device as _model_device
from ..runtime import distributed, progress
from ..runtime.batching import chunk_rows
from .assessment.infidelity import (
    infidelity_from_changes,
    square_output_changes,
    square_predictions,
)
from .evaluation.items import PREDICTED, BadItem, item_source, read_item, reference_shape
from .evaluation.job import RESUME, JobReport, UnitInput, describe_changes, run_job
from .evaluation.merge import merge_units
from .evaluation.sharding import sample_seed
from .fingerprints import digest, item_digest, library_version, model_digest
from .maps import MAP_FORMATS, save_map, save_picture
from .plans import StageCost, method_costs

__all__ = ["MAP_FORMATS", "METRICS", "RESUME", "DatasetStage", "JobReport", "attribute_dataset",
           "describe_changes", "evaluate", "infidelity_scale", "map_name", "resolve_methods"]

#: The metrics :func:`evaluate` computes.
METRICS = ("infidelity", "bbox")
_BAD_ITEM = ("refuse", "skip")
_INFIDELITY_OPTIONS = {"perturbation", "max_side", "n_perturb_samples", "noise_std",
                       "batch_size", "normalize", "scale"}


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


def _attribute(bound, model, x, targets, baseline, indices, seed, rows_bar: bool = False):
    """Attributions of a batch; a method with a ``seed`` runs per sample with its seed.
    ``rows_bar``: a bar over the model rows of the call (a terminal's view inside a long
    item; it only observes)."""
    if "seed" not in bound.spec.options():
        return bound(model, x, baseline, targets, show_progress=rows_bar).detach()
    rows = []
    for j, i in enumerate(indices):
        own = dataclasses.replace(bound, settings=MappingProxyType(
            {**bound.settings, "seed": sample_seed(seed, i)}))
        rows.append(own(model, x[j:j + 1], baseline, targets[j:j + 1],
                        show_progress=rows_bar).detach())
    return torch.cat(rows)


def _reader(dataset, shape, need_mask, on_bad_item):
    """``read(indices) -> UnitInput``: the unit's items (bad ones refused or skipped) and
    their digests (:func:`~.fingerprints.item_digest`; a skipped item's is its reason's)."""
    def read(indices) -> UnitInput:
        items, skipped = [], []
        for i in indices:
            try:
                items.append(read_item(dataset, i, shape, need_mask))
            except BadItem as exc:
                if on_bad_item == "refuse":
                    raise ValueError(f"{exc}; replace or remove it, or pass "
                                     "on_bad_item='skip' (--bad-items skip) to leave it out"
                                     ) from None
                warnings.warn(f"skipped {exc}", RuntimeWarning, stacklevel=2)
                skipped.append([i, exc.reason])
        digests = sorted([[it.index, item_digest(it.input, it.target, it.mask)] for it in items]
                         + [[i, digest(reason)] for i, reason in skipped])
        return UnitInput((items, skipped), digests)
    return read


def _batch(items, model, device):
    """``(x, targets, masks)``; an item whose target is :data:`PREDICTED` explains the
    model's top class."""
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    x = torch.stack([it.input for it in items]).to(device=device, dtype=dtype)
    t = torch.tensor([it.target for it in items], device=device)
    if (t == PREDICTED).any():
        with torch.no_grad():
            t = torch.where(t == PREDICTED, model(x).argmax(1), t)
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
    check_real(baseline, "baseline")  # the point baseline, one number
    n = len(dataset)
    if n < 1:
        raise ValueError("dataset is empty")
    dev = torch.device(device) if device is not None else None
    return n, dev


def _config(model, n, methods, batch_size, seed, on_bad_item, baseline, shape, **extra):
    """``(config, fields)``: the job's readable configuration and its fingerprint
    (:mod:`.fingerprints`)."""
    config = {"n_samples": n, "batch_size": batch_size, "seed": seed,
              "on_bad_item": on_bad_item, "baseline": float(baseline), "input_shape": list(shape),
              "methods": [[b.label, b.name, b.tag()] for b in methods], **extra}
    method = {k: config[k] for k in ("methods", "metrics", "infidelity") if k in config}
    job = {k: v for k, v in config.items() if k not in method and k not in ("seed", "n_samples")}
    fields = {"model": model_digest(model), "method": digest(method), "seed": seed,
              "version": library_version(), "job": digest(job)}
    return {**config, "model": fields["model"]}, fields


def _square_changes(model, x, t, baseline, opts: Mapping):
    """``f(x) - f(x_k)`` for every square removal of :func:`~taylorattr.metrics.infidelity`
    with ``opts``, once per unit: they do not depend on the method, so the methods of a
    unit share one set of forwards (the assessment's :func:`square_output_changes`)."""
    rows = opts.get("batch_size") or int(chunk_rows(model, x, backward=False))
    return square_output_changes(model, x, t, baseline, opts.get("max_side", 10), rows,
                                 scale=opts.get("scale", 1))


def infidelity_scale(shape) -> int:
    """The infidelity squares' scale for inputs of ``shape`` (``[..., H, W]``):
    ``min(H, W) // 28``, at least 1, so squares cover the share of the image they cover on
    MNIST (as the assessment scales its patches)."""
    return max(1, min(int(shape[-2]), int(shape[-1])) // 28) if len(shape) >= 2 else 1


@dataclass(frozen=True)
class DatasetStage:
    """The rows of :func:`evaluate` (with its ``metrics``; ``max_side`` and ``scale`` of
    the infidelity squares, ``scale`` None: :func:`infidelity_scale`) or of
    :func:`attribute_dataset` (no metrics): every method on every unit of ``batch_size``
    samples, counted by :meth:`cost` before the job runs."""

    methods: tuple
    metrics: tuple = ()
    batch_size: int = 16
    max_side: int = 10
    scale: int | None = None

    def cost(self, model, dataset, label: str, device=None) -> StageCost:
        """The job's rows on ``model`` (timed on one input moved to ``device``)."""
        n = len(dataset)
        shape = reference_shape(dataset, n)
        scale = self.scale or infidelity_scale(shape)
        methods = resolve_methods(list(self.methods))
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()),
                     torch.float32)
        costs, skipped = [], []
        full, rest = divmod(n, self.batch_size)
        for b, units in ((self.batch_size, full), (rest, 1 if rest else 0)):
            if not units:
                continue
            x = torch.zeros((b,) + tuple(shape), dtype=dtype, device=_model_device(model))
            c, skipped = method_costs(methods, model, x)
            if "infidelity" in self.metrics and len(methods) > len(skipped):  # shared
                c.append(infidelity_cost(x, max_side=self.max_side, scale=scale))
            costs += c * units
        model = model.to(device) if device is not None else model
        x = torch.zeros((1,) + tuple(shape), dtype=dtype, device=device)
        return StageCost(label, ((costs, model, x),), n, tuple(skipped))


def _namer(dataset):
    """How messages name item ``i``: its index and, for a folder, its file."""
    def name(i: int) -> str:
        source = item_source(dataset, i)
        return f"{i} ({source})" if source else str(i)
    return name


def evaluate(model, dataset, methods, metrics=("infidelity",), *, out, batch_size: int = 16,
             seed: int = 0, baseline: float = 0.0, on_bad_item: str = "refuse",
             infidelity_options: Mapping | None = None, input_shape=None,
             device=None, resume: str = "auto", show_progress: bool = False) -> JobReport:
    """Attribute and score every sample of ``dataset`` (see the module docstring).

    Args:
        model: classifier ``[B, ...] -> [B, classes]`` (moved to this rank's device).
        dataset: map-style, items ``(input, target[, box_mask])``; a target of
            :data:`~.evaluation.items.PREDICTED` (-1) explains the predicted class.
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
            (``max_side``, ``scale``, ``perturbation``, ``n_perturb_samples``,
            ``noise_std``, ``batch_size``, ``normalize``; :func:`infidelity_scale` gives the
            assessment's scale for an image size).
        input_shape: the expected input shape (default: the first readable item's).
        device: force a device (default ``cuda:LOCAL_RANK`` if CUDA is available).
        resume: ``"auto"`` recomputes exactly the items whose fingerprint (model,
            input, methods and options, seed, library version) changed, and reports
            it in :attr:`JobReport.changes`; ``"strict"`` refuses such a rerun naming
            what changed (:mod:`.evaluation.job`).
        show_progress: show this process's items as a stage
            (:func:`taylorattr.runtime.progress.stage`: a bar on a terminal, a line as it
            starts and one when done in a log).

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
    if square and {"n_perturb_samples", "noise_std"} & set(opts):
        raise ValueError("infidelity_options: n_perturb_samples and noise_std do not apply to "
                         "perturbation='square' (its squares are fixed by the image size, "
                         "max_side and scale)")
    shape = tuple(input_shape) if input_shape is not None else reference_shape(dataset, n)
    need_mask = "bbox" in metrics
    config, fields = _config(model, n, bound, batch_size, seed, on_bad_item, baseline, shape,
                             kind="evaluate", metrics=metrics, infidelity=opts)

    def compute(todo: list[int], data) -> dict:
        items, skipped = _only(data, todo)
        device = dev or _model_device(model)
        scores = {b.label: {k: torch.zeros(0, dtype=torch.float64, device="cpu") for k in metrics}
                  for b in bound}
        t = torch.zeros(0, dtype=torch.long, device="cpu")
        if items:
            x, t, masks = _batch(items, model, device)
            idx = [it.index for it in items]
            changes = None  # the square removals' output changes, shared by every method
            for b in bound:
                a = _attribute(b, model, x, t, baseline, idx, seed, rows_bar)
                if "infidelity" in metrics:
                    if square:
                        if changes is None:
                            changes = _square_changes(model, x, t, baseline, opts)
                        s = infidelity_from_changes(
                            square_predictions(a, opts.get("max_side", 10), opts.get("scale", 1)),
                            changes, opts.get("normalize", True)).to(x.dtype)
                    else:
                        s = torch.cat([infidelity(model, x[j:j + 1], a[j:j + 1], t[j:j + 1],
                                                  seed=sample_seed(seed, i), **opts)
                                       for j, i in enumerate(idx)])
                    scores[b.label]["infidelity"] = s.detach().to("cpu", torch.float64)
                if "bbox" in metrics:
                    scores[b.label]["bbox"] = bbox_accuracy(a, masks).to("cpu", torch.float64)
        t = t.cpu()
        return _per_item(items, skipped, lambda j: {
            "targets": t[j:j + 1],
            "scores": {m: {k: v[j:j + 1] for k, v in s.items()} for m, s in scores.items()}},
            {"targets": t[:0], "scores": {m: {k: torch.zeros(0, dtype=torch.float64, device="cpu")
                                              for k in metrics} for m in scores}})

    model = _prepare(model, dev)
    per_call = _items_per_call(bound, model, shape, batch_size)
    # an item computed alone is long: on a terminal a bar shows its model rows
    rows_bar = per_call == 1 and show_progress and progress.interactive()
    return run_job(Path(out), config, fields, n, batch_size,
                   _reader(dataset, shape, need_mask, on_bad_item), compute,
                   lambda units: merge_units(units, [b.label for b in bound], metrics, Path(out)),
                   device=dev, resume=resume, name_item=_namer(dataset),
                   progress=_stage(show_progress, "evaluate",
                                   ", ".join(b.label for b in bound)),
                   items_per_call=per_call)


#: An item on which the methods run at least this many model rows (forwards and
#: backwards, :meth:`~taylorattr.runtime.cost.Cost.rows`) is computed, stored and counted
#: on its own (progress moves per item, an interrupt keeps every finished one); cheaper
#: items are computed a unit at a time (one batch: quicker, and done in moments).
ITEM_ROWS = 16


def _items_per_call(methods, model, shape, batch_size: int) -> int:
    """How many of a unit's items one compute call takes (:data:`ITEM_ROWS`)."""
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()),
                 torch.float32)
    x = torch.zeros((1,) + tuple(shape), dtype=dtype, device=_model_device(model))
    costs, _ = method_costs(methods, model, x)
    return 1 if sum(c.rows for c in costs) >= ITEM_ROWS else batch_size


def _stage(show: bool, command: str, label: str):
    """``progress(total)`` of :func:`~.evaluation.job.run_job`: the items as one stage of
    ``command`` (:func:`taylorattr.runtime.progress.stage`: a bar on a terminal, lines in
    a log), or None without ``show``."""
    if not isinstance(show, bool):
        raise TypeError(f"show_progress must be a bool, got {type(show).__name__}")
    return functools.partial(progress.stage, command, label, unit="item") if show else None


def _prepare(model, dev):
    if dev is None:
        _, _, local = distributed.env_world()
        dev = torch.device(f"cuda:{local}") if torch.cuda.is_available() else torch.device("cpu")
    return model.to(dev).eval()


def map_name(dataset, index: int, fmt: str) -> str:
    """Where the map of item ``index`` goes under ``out``: the item's file path relative
    to the data folder with ``.<fmt>`` added (``cat/a.jpg.npy``), or ``<index:06d>.<fmt>``
    for items without a file."""
    source = item_source(dataset, index)
    return f"{source}.{fmt}" if source else f"{index:06d}.{fmt}"


def attribute_dataset(model, dataset, method, *, out, batch_size: int = 16, seed: int = 0,
                      baseline: float = 0.0, on_bad_item: str = "refuse", previews: bool = False,
                      input_shape=None, device=None, resume: str = "auto",
                      map_format: str = "pt", show_progress: bool = False) -> JobReport:
    """Attributions of every sample, saved under ``out`` named by :func:`map_name` in
    ``map_format`` (:data:`MAP_FORMATS`; ``pt``: a dict with ``attribution``, ``index``,
    ``target``, ``method``, ``source``) and, with ``previews``, a PNG beside each map
    (:func:`preview_name`; channel-summed map, red positive, blue negative, symmetric
    scale).
    ``out/index.csv`` maps every map to its input (``index``, ``source``), the explained
    ``target`` and whether it is the item's label or the predicted class. Same sharding,
    seeds, lock, fingerprinted resume (``resume``) and bad-item handling as
    :func:`evaluate` (a changed item is recomputed alone, the others' maps are kept);
    ``summary.json`` lists what was written and skipped. Maps a previous run listed that
    no current item writes are removed."""
    n, dev = _common(model, dataset, batch_size, seed, on_bad_item, baseline, device)
    (bound,) = resolve_methods([method] if not isinstance(method, list) else method)
    if not isinstance(previews, bool):
        raise TypeError(f"previews must be a bool, got {type(previews).__name__}")
    if map_format not in MAP_FORMATS:
        raise ValueError(f"map_format must be one of {MAP_FORMATS}, got {map_format!r}")
    shape = tuple(input_shape) if input_shape is not None else reference_shape(dataset, n)
    config, fields = _config(model, n, [bound], batch_size, seed, on_bad_item, baseline, shape,
                             kind="attribute", previews=previews, map_format=map_format)
    out = Path(out)

    def compute(todo: list[int], data) -> dict:
        items, skipped = _only(data, todo)
        device = dev or _model_device(model)
        rows = []
        if items:
            x, t, _ = _batch(items, model, device)
            a = _attribute(bound, model, x, t, baseline, [it.index for it in items], seed,
                           rows_bar).cpu()
            for j, it in enumerate(items):
                name = map_name(dataset, it.index, map_format)
                save_map(a[j], out / name, map_format, {
                    "index": it.index, "target": int(t[j]), "method": bound.label,
                    "source": item_source(dataset, it.index) or ""})
                if previews:
                    save_picture(a[j], out / preview_name(name))
                rows.append([it.index, item_source(dataset, it.index) or "", name,
                             int(t[j]), "predicted" if it.target == PREDICTED else "label"])
        return _per_item(items, skipped, lambda j: {"rows": [rows[j]]}, {"rows": []})

    def merge(units):
        rows = [r for u in units for r in u["rows"]]
        old = _listed(out / "index.csv")
        _io.save_csv([dict(zip(_INDEX_FIELDS, r)) for r in rows], out / "index.csv",
                     _INDEX_FIELDS)
        _remove_stale(out, old, {r[2] for r in rows})
        targets = sorted({r[4] for r in rows})
        result = {"method": bound.label, "n_written": len(rows),
                  "skipped": [[int(i), str(r)] for u in units for i, r in u["skipped"]],
                  "maps": "beside index.csv, which lists them", "targets": targets}
        _io.save_json(result, out / "summary.json")
        return result

    model = _prepare(model, dev)
    per_call = _items_per_call([bound], model, shape, batch_size)
    rows_bar = per_call == 1 and show_progress and progress.interactive()  # as evaluate's
    return run_job(out, config, fields, n, batch_size,
                   _reader(dataset, shape, False, on_bad_item), compute, merge, device=dev,
                   resume=resume, name_item=_namer(dataset),
                   progress=_stage(show_progress, "attribute", bound.label),
                   kept=lambda r: all(_still_there(out, row, dataset, previews)
                                      for row in r["rows"]),
                   items_per_call=per_call)


_INDEX_FIELDS = ["index", "source", "map", "target", "explained"]


def _still_there(out: Path, row: list, dataset, previews: bool) -> bool:
    """Whether a stored map (an ``index.csv`` row) can be reused: its item still comes
    from the same file (a renamed image with the same pixels gets its map under its new
    name) and the map (and its preview) are still on disk."""
    index, source, name = int(row[0]), row[1], row[2]
    return (source == (item_source(dataset, index) or "") and (out / name).is_file()
            and (not previews or (out / preview_name(name)).is_file()))


def preview_name(name: str) -> str:
    """The PNG preview beside the map ``name`` (``cat/a.jpg.pt`` -> ``cat/a.jpg.preview.png``)."""
    return f"{name.rsplit('.', 1)[0]}.preview.png"


def _listed(index: Path) -> set[str]:
    """The maps a previous run listed in ``index.csv`` (none when there is no file)."""
    try:
        return {r["map"] for r in _io.load_csv(index)}
    except (FileNotFoundError, KeyError, ValueError):
        return set()


def _remove_stale(out: Path, old: set[str], kept: set[str]) -> None:
    """Remove the maps (and their previews) a previous run listed in ``index.csv`` that no
    current item wrote: a rerun on a smaller or renamed dataset leaves no map of another
    input behind; files the job did not write are never touched."""
    root = out.resolve()
    for name in old - kept:
        for p in (out / name, out / preview_name(name)):
            if p.resolve().is_relative_to(root) and p.is_file() \
                    and p.suffix.lstrip(".") in MAP_FORMATS:
                p.unlink()


def _only(data, todo) -> tuple[list, list]:
    """The items and skipped items of a unit's ``data`` whose index is in ``todo``."""
    keep = set(todo)
    items, skipped = data
    return [it for it in items if it.index in keep], [s for s in skipped if s[0] in keep]


def _per_item(items, skipped, result, empty: dict) -> dict:
    """``{index: result}`` of a computed batch: ``result(j)`` for row ``j`` of ``items``
    (with its ``indices``) and, for a skipped item, its reason with the ``empty`` fields
    (no row)."""
    out = {it.index: {"indices": torch.tensor([it.index], dtype=torch.long, device="cpu"), "skipped": [],
                      **result(j)} for j, it in enumerate(items)}
    for i, reason in skipped:
        out[int(i)] = {"indices": torch.zeros(0, dtype=torch.long, device="cpu"),
                       "skipped": [[int(i), reason]], **empty}
    return out
