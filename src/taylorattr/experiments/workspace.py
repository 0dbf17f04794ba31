"""The experiment workspace: one object every stage receives.

A :class:`Workspace` holds what the stages share: the output folder, the seed, quick or
full mode, where MNIST comes from, the training recipe (``training``: a preset name of
:data:`taylorattr.models.training.PRESETS` or a
:class:`~taylorattr.models.training.TrainSettings`; part of every model's cache key), the
training-epochs override, the training seeds of the multi-seed stages and whether to show
progress; and it loads, once per workspace, what several stages use: the held-out
digits, the held-out cluttered canvases (bounding boxes) and the trained models (cached
on disk under ``out/models`` by :func:`taylorattr.models.get_trained`)::

    ws = Workspace("results", seed=0, quick=True)
    x = ws.held_out_digits(150)                 # [150, 1, 28, 28] float32 in [0, 1]
    model, info = ws.trained("c_sg")            # trained (or loaded) and cached
    validation = run_validation(ws, orders=(2, 3))
    small = ws.for_training("paper-like", seed=1)  # same folder, another recipe and seed

Data-dependent method settings: a registry variant whose references are the training
digits holds a :class:`TrainingDigits` (a lazy :class:`~taylorattr.baselines.ReferenceSet`
of the bundled digits); :meth:`Workspace.method_kwargs` rebinds it to the workspace's own
MNIST source, as ``run_assessment(ws, method_kwargs=ws.method_kwargs("assessment"))``.

Devices: the models are built on the default device (``torch.get_default_device()``,
the CPU unless a user sets another), and the shared data, read from files on the CPU, is
moved there once, so every stage feeds a model data on its own device.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from .. import data, models
from .._validation import check_bool, check_positive_int, check_seed
from ..data.references import TrainingDigits
from ..models.training import TrainSettings, resolve_training
from ..paper_methods import variants
from ..runtime.distributed import Context
from ._units import UnitStore, model_fingerprint

__all__ = ["TrainingDigits", "Workspace"]

@dataclass
class Workspace:
    """Settings and shared data of one run of the experiments (see the module docstring)."""

    out: Path
    seed: int = 0
    quick: bool = True
    mnist_dir: Path | None = None
    epochs: int | None = None
    progress: bool = True
    training: TrainSettings | str = "default"
    seeds: tuple[int, ...] | None = None
    context: Context = field(default_factory=Context)  # this process's rank under torchrun
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        self.out = Path(self.out)
        check_seed(self.seed)
        check_bool(self.quick, "quick")
        check_bool(self.progress, "progress")
        if self.epochs is not None and (isinstance(self.epochs, bool)
                                        or not isinstance(self.epochs, int) or self.epochs < 0):
            raise ValueError(f"epochs must be None or an int >= 0, got {self.epochs!r}")
        self.training = resolve_training(self.training)
        if self.seeds is None:
            self.seeds = (self.seed,)
        else:
            if isinstance(self.seeds, (str, bytes)) or not hasattr(self.seeds, "__iter__"):
                raise TypeError(f"seeds must be a sequence of ints, got {type(self.seeds).__name__}")
            self.seeds = tuple(check_seed(s) for s in self.seeds)
            if not self.seeds or len(set(self.seeds)) != len(self.seeds):
                raise ValueError(f"seeds must be distinct and at least one, got {self.seeds}")

    @property
    def preset(self) -> str:
        """The name of the training recipe (``default``, ``paper-like`` or a custom name)."""
        return self.training.name

    def for_training(self, training: TrainSettings | str | None = None,
                     seed: int | None = None) -> Workspace:
        """A workspace on the same folder and data with another recipe and/or training seed
        (models are cached by their settings, so the two never share a model)."""
        ws = replace(self, training=self.training if training is None else training,
                     seed=self.seed if seed is None else seed, seeds=None)
        for key in ("split", "canvases"):  # data does not depend on training
            if key in self._cache:
                ws._cache[key] = self._cache[key]
        return ws

    def method_kwargs(self, experiment: str) -> dict[str, dict]:
        """``{label: {"baselines": TrainingDigits(n, this mnist_dir)}}`` for every registered
        variant of ``experiment`` whose references are the training digits of another source
        (pass it as ``method_kwargs`` so those methods draw from this workspace's data)."""

        out = {}
        for spec, v in variants(experiment):
            ref = v.settings.get("baselines")
            if isinstance(ref, TrainingDigits) and ref.mnist_dir != (
                    None if self.mnist_dir is None else Path(self.mnist_dir)):
                label = spec.bind(v).label
                out[label] = {"baselines": TrainingDigits(ref.n, self.mnist_dir)}
        return out

    def units(self, stage: str) -> UnitStore:
        """The resumable unit store of ``stage`` (``out/<stage>/units``)."""
        return UnitStore(self.out / stage / "units")

    def _cached(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def held_out_split(self):
        """The fixed MNIST split (:func:`taylorattr.data.mnist_split`, seed 0), on the
        default device (where the models are)."""

        return self._cached("split", lambda: _on_default_device(
            data.mnist_split(*data.load_mnist(self.mnist_dir), seed=0)))

    def held_out_digits(self, n: int | None = None) -> torch.Tensor:
        """The first ``n`` held-out digits ``[n, 1, 28, 28]`` (all when None)."""
        held = self.held_out_split().held_images
        if n is None:
            return held
        check_positive_int(n, "n")
        if n > held.shape[0]:
            raise ValueError(f"n_samples={n} exceeds the {held.shape[0]} held-out digits")
        return held[:n]

    def canvases(self):
        """The held-out cluttered-MNIST canvases with their box masks (bounding-box stage),
        on the default device (where the models are)."""

        return self._cached("canvases", lambda: _on_default_device(
            models.held_out_canvases(self.mnist_dir)))

    def trained(self, name: str, dtype: torch.dtype | None = None):
        """``(model, info)``: the registered model ``name`` trained with this workspace's
        settings (recipe, seed, epochs; cached in memory and under ``out/models`` by those), in eval mode, cast to ``dtype``."""

        def fit():
            return models.get_trained(name, self.out, seed=self.seed, quick=self.quick,
                                      mnist_dir=self.mnist_dir, epochs=self.epochs,
                                      show_progress=self.progress, training=self.training)

        def train():  # under torchrun rank 0 trains and caches, the others then load it
            if self.context.world_size == 1:
                return fit()
            if self.context.is_main:
                result = fit()
                self.context.barrier()
                return result
            self.context.barrier()
            return fit()
        model, info = self._cached(("model", name), train)
        if dtype is not None:
            model = self._cached(("model", name, dtype),
                                 lambda: _cast(model, dtype))
        return model.eval(), info

    @property
    def is_main(self) -> bool:
        """Whether this process writes the tables (rank 0, or the only process)."""
        return self.context.is_main

    def run_units(self, store: UnitStore, items, desc: str = "") -> list:
        """``[store.get(key, compute) for key, compute in items]``; under torchrun each rank
        first computes every ``world_size``-th unit (its shard, by position, so the split
        does not depend on timing), then, after a barrier, every rank loads them all. The
        results, and so the tables, are the same for any world size."""
        from tqdm.auto import tqdm

        items = list(items)
        ctx = self.context
        mine = items[ctx.rank::ctx.world_size] if ctx.world_size > 1 else items
        out = [store.get(key, compute) for key, compute in
               tqdm(mine, desc=desc or None, disable=not self.progress or not desc)]
        if ctx.world_size == 1:
            return out
        ctx.barrier()
        return [store.get(key, compute) for key, compute in items]

    def fingerprint(self, model) -> str:
        """A short hash of a model's weights (unit keys follow the weights)."""
        return model_fingerprint(model)


def _on_default_device(tensors):
    """A named tuple of tensors (``MnistSplit``, ``ClutteredMnist``) on the default device."""
    return type(tensors)(*(t.to(torch.get_default_device()) for t in tensors))


def _cast(model, dtype):
    import copy

    return copy.deepcopy(model).to(dtype)
