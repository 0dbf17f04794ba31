"""Saliency maps of the six methods and of first- and second-order Taylor attribution
(paper Figure 5), as data: one ``[H, W]`` map per (image, method), channels summed.

A method that cannot run on a model (DeepLIFT on a network with layers it has no rule
for, say) is recorded with its error message instead of a map; nothing falls back to
another method. Each image is a resumable unit under ``out/saliency/units``.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..methods import METHODS
from ..principles import EG_NOISE_STD
from ..taylor import taylor_attribution
from ._units import UnitStore, fingerprint, model_fingerprint

__all__ = ["SaliencyPanel", "method_table", "run_saliency", "saliency_maps"]


@dataclass
class SaliencyPanel:
    """One image and its maps: ``maps[label]`` is ``[H, W]`` or the reason it is missing."""

    name: str
    image: torch.Tensor  # [H, W] or [3, H, W] in [0, 1] for display
    predicted: str
    maps: dict[str, torch.Tensor | str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def method_table(patch: int, ig_steps: int, eg_samples: int, eg_noise: float) -> dict:
    """Label -> (registry name or ``taylor-K``, keyword arguments) for the grid's columns."""
    return {
        "GI": ("gradient_input", {}),
        f"Occ-{patch}x{patch}": ("occlusion_patch", {"patch": patch}),
        "DL": ("deeplift", {}),
        "IG (black)": ("integrated_gradients", {"n_steps": ig_steps}),
        "EG": ("expected_gradients", {"noise_std": eg_noise, "n_samples": eg_samples}),
        "Taylor-1": ("taylor-1", {}),
        "Taylor-2": ("taylor-2", {}),
    }


def saliency_maps(model, x: torch.Tensor, target: int, methods: dict) -> tuple[dict, list[str]]:
    """Channel-summed maps ``[H, W]`` of every method for one input ``x`` ``[1, C, H, W]``."""
    maps, notes = {}, []
    t = torch.tensor([target])
    for label, (name, kw) in methods.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                if name.startswith("taylor-"):
                    a = taylor_attribution(model, x, 0.0, t, int(name.split("-")[1]))
                elif name == "expected_gradients":
                    a = METHODS[name](model, x, target=t, **kw)
                elif METHODS[name].uses_baselines:
                    a = METHODS[name](model, x, baselines=0.0, target=t, **kw)
                else:
                    a = METHODS[name](model, x, target=t, **kw)
                maps[label] = a[0].sum(0).detach().float()
            except (TypeError, ValueError) as exc:
                maps[label] = f"not supported: {str(exc).splitlines()[0]}"
        notes += sorted({f"{label}: {str(w.message).splitlines()[0]}" for w in caught
                         if issubclass(w.category, UserWarning)})
    return maps, notes


def _stored_maps(store: UnitStore, key: str, model, x, target: int, methods) -> tuple[dict, list]:
    """The maps of one image from the store, computed (and stored) when missing."""
    def compute():
        maps, notes = saliency_maps(model, x, target, methods)
        return {"maps": {k: v for k, v in maps.items() if isinstance(v, torch.Tensor)},
                "missing": {k: v for k, v in maps.items() if isinstance(v, str)}, "notes": notes}

    unit = store.get(key, compute)
    maps = {**unit["maps"], **unit["missing"]}
    return {label: maps[label] for label in methods}, unit["notes"]


def _digit_panels(out: Path, store: UnitStore, quick: bool, seed: int, mnist_dir, methods, progress,
                  n_digits: int, epochs: int | None):
    from .. import data, models

    model, _ = models.get_trained("c_sp", out, seed=seed, quick=quick, mnist_dir=mnist_dir,
                                  epochs=epochs, show_progress=progress)
    images, labels = data.load_mnist(mnist_dir)
    held = data.mnist_split(images, labels, seed=0).held_images
    panels = []
    for i in range(n_digits):
        x = held[i:i + 1]
        target = int(model(x).argmax())
        key = f"digit-{fingerprint([('x', x)])}-{model_fingerprint(model)}-quick{quick}"
        maps, notes = _stored_maps(store, key, model, x, target, methods)
        panels.append(SaliencyPanel(f"digit {i}", x[0, 0], f"C-sp predicts {target}", maps, notes))
    return panels


def _photo_panels(store: UnitStore, quick: bool, methods, photo_names):
    from .. import data, models

    model = models.efficientnet_lite0()
    photos = dict(data.sample_photos())
    panels = []
    for name in photo_names:
        x = model.preprocess(photos[name])
        with torch.no_grad():
            target = int(model(x).argmax())
        maps, notes = _stored_maps(store, f"photo-{name}-quick{quick}", model, x, target, methods)
        panels.append(SaliencyPanel(name, model.unnormalize(x[0]),
                                    f"EfficientNet-Lite0: {model.class_name(target)}", maps, notes))
    return panels


def run_saliency(out_dir, quick: bool = True, seed: int = 0, mnist_dir=None,
                 show_progress: bool = True, n_digits: int | None = None,
                 photos: tuple[str, ...] | None = None, epochs: int | None = None
                 ) -> list[SaliencyPanel]:
    """Maps for held-out MNIST digits (C-sp) and for bundled photos (EfficientNet-Lite0).

    Defaults: 3 digits and the photos ``camera`` and ``chelsea`` when ``quick`` (occlusion
    patch 32, 16 IG steps and EG samples on the photos), else 6 digits and 4 photos (patch 16,
    50 steps and samples). The photo ``camera`` (a dark coat against a light sky) shows the
    black-baseline bias of IG that EG's noise baselines avoid (paper section on baselines).
    """
    out = Path(out_dir)
    store = UnitStore(out / "saliency" / "units")
    if n_digits is None:
        n_digits = 3 if quick else 6
    if photos is None:
        photos = ("camera", "chelsea") if quick else ("camera", "chelsea", "astronaut", "coffee")
    digit_methods = method_table(patch=4, ig_steps=50, eg_samples=50, eg_noise=EG_NOISE_STD)
    photo_methods = method_table(patch=32 if quick else 16, ig_steps=16 if quick else 50,
                                 eg_samples=16 if quick else 50, eg_noise=EG_NOISE_STD)
    panels = _digit_panels(out, store, quick, seed, mnist_dir, digit_methods, show_progress, n_digits,
                           epochs)
    if photos:
        panels += _photo_panels(store, quick, photo_methods, photos)
    return panels
