"""Saliency maps of every method registered for the grid (by default the paper's six and
first- and second-order Taylor attribution; paper Figure 5), as data: one ``[H, W]`` map
per (image, method), channels summed.

A method that cannot run on a model (DeepLIFT on a network with layers it has no rule
for, say) is recorded with its error message instead of a map; nothing falls back to
another method. Each image is a resumable unit under ``out/saliency/units``.
"""
from __future__ import annotations

import re
import textwrap
import warnings
from dataclasses import dataclass, field

import torch

from .. import data, models
from ..baselines import Point
from ..paper_methods import variants
from ..taylor.smoothing import smooth
from ._units import UnitStore, fingerprint, model_fingerprint
from .fingerprints import digest
from .plans import StageCost, architecture, forwards, method_costs
from .workspace import Workspace

__all__ = ["SaliencyPanel", "SaliencyStage", "methods_tag", "refusal_reason", "run_saliency",
           "saliency_maps", "saliency_methods", "smoothed_taylor_model", "taylor_maps"]


@dataclass
class SaliencyPanel:
    """One image and its maps: ``maps[label]`` is ``[H, W]`` or the reason it is missing."""

    name: str
    image: torch.Tensor  # [H, W] or [3, H, W] in [0, 1] for display
    predicted: str
    maps: dict[str, torch.Tensor | str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def saliency_methods(patch: int, steps: int, samples: int, seed: int = 0) -> list:
    """The grid's bound methods, with the occlusion patch, the path steps (``n_steps``) and
    the sampled references (``n_samples``) set for the image size."""
    context = {"patch": patch, "n_steps": steps, "n_samples": samples, "seed": seed}
    return [spec.bind(v, context=context) for spec, v in variants("saliency")]


def saliency_maps(model, x: torch.Tensor, target: int, methods, show_progress: bool = False
                  ) -> tuple[dict, list[str]]:
    """Channel-summed maps ``[H, W]`` of every bound method for one input ``x`` ``[1, C, H, W]``
    (against the black image); a method that cannot run gets the reason instead.
    ``show_progress``: each method's per-chunk bar."""
    maps, notes = {}, []
    t = torch.tensor([target], device=x.device)
    for method in methods:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                a = method(model, x, Point(0.0), t, show_progress=show_progress,
                           desc="saliency")
                maps[method.label] = a[0].sum(0).detach().float()
            except (TypeError, ValueError) as exc:
                maps[method.label] = f"not supported: {refusal_reason(exc)}"
        notes += sorted({f"{method.label}: {str(w.message).splitlines()[0]}" for w in caught
                         if issubclass(w.category, UserWarning)})
    return maps, notes


def taylor_maps(net, x, target: int, columns: dict, taylor_model,
                show_progress: bool = False) -> tuple[dict, list[str], dict]:
    """The maps of every column, the notes, and the map key of each Taylor order; Taylor
    expansions (methods with an ``order``) run on ``taylor_model(net)`` when given (a
    smoothed copy, say), the others on ``net``."""
    others = [m for m in columns.values() if "order" not in m.settings]
    taylor = [m for m in columns.values() if "order" in m.settings]
    maps, notes = saliency_maps(net, x, target, others, show_progress)
    if taylor:
        expanded, note = (net, "") if taylor_model is None else taylor_model(net)
        t_maps, t_notes = saliency_maps(expanded, x, target, taylor, show_progress)
        suffix = f" ({short_note(note)})" if note else ""
        maps.update({label + suffix: v for label, v in t_maps.items()})
        notes += t_notes + ([f"Taylor panels: {note}"] if short_note(note) != note else [])
        return maps, notes, {m.settings["order"]: m.label + suffix for m in taylor}
    return maps, notes, {}


def smoothed_taylor_model(x, target: int, beta: float | str):
    """``taylor_model`` hook: ``ta.smooth(net, beta, inputs=x)`` (``beta="auto"``: the
    smallest beta whose output gap on the photo is within 5% of its output change) with a
    note of the beta, its gap and the class. A classifier whose network holds its kinks
    in a captured graph (a ``.pt2`` program) is smoothed through that network
    (``ImageClassifier.forward`` is ``net(x)``); one with no kink at all is expanded as
    it is."""
    def hook(net):
        sm = smooth(net, beta, inputs=x)
        inner = getattr(net, "net", None)
        if not sm.replaced and isinstance(inner, torch.nn.Module):
            sm = smooth(inner, beta, inputs=x)
        if not sm.replaced:
            return net, ""
        with torch.no_grad():
            predicted = int(sm(x).argmax(1)[0])
        same = "same class" if predicted == target else f"predicts class {predicted}"
        chosen = (f"beta = {sm.beta:g} (auto: gap {sm.relative_gap:.0%} of |df|)"
                  if beta == "auto" else f"beta = {sm.beta:g}")
        return sm, f"smoothed, {chosen}, output gap {sm.output_gap:.2g}, {same}"
    return hook


def short_note(note: str) -> str:
    """A Taylor panel's suffix for its title: ``"smooth β=20"`` of a smoothing note (the
    whole note goes to the figure's footer), else the note."""
    found = re.match(r"smoothed, beta = ([0-9.e+-]+)", note)
    return f"smooth β={found.group(1)}" if found else note


def refusal_reason(exc: BaseException) -> str:
    """What a refusal says in one line: the message's first line, or, for an error that
    wraps the model's own (``model ... failed on inputs ...: RuntimeError: ...``), that
    error: the operation and its reason (the wrapper's prefix hid it in a small panel)."""
    cause = exc.__cause__
    if cause is not None and str(cause).strip():
        line = next(ln for ln in str(cause).splitlines() if ln.strip()).strip()
        return f"{type(cause).__name__}: {line}"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _stored_maps(store: UnitStore, key: str, model, x, target: int, methods,
                 progress: bool = False) -> tuple[dict, list]:
    """The maps of one image from the store, computed (and stored) when missing."""
    def compute():
        maps, notes = saliency_maps(model, x, target, methods, progress)
        return {"maps": {k: v for k, v in maps.items() if isinstance(v, torch.Tensor)},
                "missing": {k: v for k, v in maps.items() if isinstance(v, str)}, "notes": notes}

    unit = store.get(key, compute)
    maps = {**unit["maps"], **unit["missing"]}
    return {m.label: maps[m.label] for m in methods}, unit["notes"]


def methods_tag(methods) -> str:
    """A short hash of the methods and their settings (seeds, windows, steps): a map drawn
    with other settings is never taken from the store."""
    return digest([[m.label, m.name, m.tag()] for m in methods])


def _digit_panels(ws: Workspace, store: UnitStore, methods, n_digits: int):
    model, _ = ws.trained("c_sp")
    held = ws.held_out_digits()
    panels = []
    for i in range(n_digits):
        x = held[i:i + 1]
        target = int(model(x).argmax())
        key = f"digit-{fingerprint([('x', x)])}-{ws.fingerprint(model)}-{methods_tag(methods)}"
        maps, notes = _stored_maps(store, key, model, x, target, methods, ws.progress)
        panels.append(SaliencyPanel(f"digit {i}", x[0, 0], f"C-sp predicts {target}", maps, notes))
    return panels


def _photo_panels(store: UnitStore, methods, photo_names, progress: bool = False):
    """EfficientNet-Lite0 on each photo. The Taylor panels expand the smoothed network, as
    ``taylorattr explain`` does (``ta.smooth(net, beta="auto", inputs=photo)``: ReLU6
    replaced by its smooth surrogate, beta the smallest whose output gap is within 5% of
    the output change), since the ReLU6 network's Taylor-1 and Taylor-2 are both
    Gradient*Input; the row's title states beta and the output gap."""

    model = models.efficientnet_lite0()
    photos = dict(data.sample_photos())
    panels = []
    for name in photo_names:
        x = model.preprocess(photos[name])
        with torch.no_grad():
            target = int(model(x).argmax())
        key = (f"photo-smoothed-auto-{name}-{fingerprint([('x', x)])}-"
               f"{model_fingerprint(model)}-{methods_tag(methods)}")

        def compute(x=x, target=target):
            said = []
            hook = smoothed_taylor_model(x, target, "auto")

            def smoothed(net):
                expanded, note = hook(net)
                said.append(note)
                return expanded, ""

            maps, notes, _ = taylor_maps(model, x, target, {m.label: m for m in methods}, smoothed,
                                   progress)
            return {"maps": {k: v for k, v in maps.items() if isinstance(v, torch.Tensor)},
                    "missing": {k: v for k, v in maps.items() if isinstance(v, str)},
                    "notes": notes, "taylor": said[0] if said else ""}

        unit = store.get(key, compute)
        maps = {**unit["maps"], **unit["missing"]}
        maps = {m.label: maps[m.label] for m in methods}
        title = f"EfficientNet-Lite0: {model.class_name(target)}"
        if unit.get("taylor"):  # the Taylor panels' network, under the class
            title += "\n" + "\n".join(textwrap.wrap(f"Taylor: {unit['taylor']}", 34))
        panels.append(SaliencyPanel(name, model.unnormalize(x[0]), title, maps,
                                    unit["notes"]))
    return panels


@dataclass(frozen=True)
class SaliencyStage:
    """The saliency grids' settings, defaults resolved here: 3 digits and the photos
    ``camera`` and ``chelsea`` when ``quick`` (occlusion patch 32, 16 path steps and
    sampled references on the photos), else 6 digits and 4 photos (patch 16, 50 steps and
    samples); the digits always with patch 4 and 50 steps and samples. :meth:`cost`
    counts the rows."""

    quick: bool = True
    seed: int = 0
    digits: int | None = None
    photos: tuple[str, ...] | None = None

    @property
    def n_digits(self) -> int:
        return self.digits if self.digits is not None else (3 if self.quick else 6)

    @property
    def photo_names(self) -> tuple[str, ...]:
        if self.photos is not None:
            return tuple(self.photos)
        return ("camera", "chelsea") if self.quick else ("camera", "chelsea", "astronaut", "coffee")

    def digit_methods(self) -> list:
        return saliency_methods(patch=4, steps=50, samples=50, seed=self.seed)

    def photo_methods(self) -> list:
        return saliency_methods(patch=32 if self.quick else 16, steps=16 if self.quick else 50,
                                samples=16 if self.quick else 50, seed=self.seed)

    def cost(self) -> StageCost:
        """C-sp (untrained copy) on each digit, EfficientNet-Lite0 on each photo: one
        target forward and every method."""

        digits = torch.zeros(1, 1, 28, 28, device=torch.get_default_device())
        c_sp = architecture("c_sp", self.seed)
        costs, skipped = method_costs(self.digit_methods(), c_sp, digits)
        parts = [([forwards(1), *costs] * self.n_digits, c_sp, digits)]
        if self.photo_names:
            net = models.efficientnet_lite0()
            x = net.preprocess(dict(data.sample_photos())[self.photo_names[0]])
            costs, more = method_costs(self.photo_methods(), net, x)
            parts.append(([forwards(1), *costs] * len(self.photo_names), net, x))
            skipped += more
        return StageCost("saliency on C-sp and EfficientNet-Lite0", tuple(parts),
                         self.n_digits + len(self.photo_names), tuple(skipped))


def run_saliency(ws: Workspace, n_digits: int | None = None,
                 photos: tuple[str, ...] | None = None) -> list[SaliencyPanel]:
    """Maps for held-out MNIST digits (C-sp) and for bundled photos (EfficientNet-Lite0),
    with the settings of :class:`SaliencyStage` ``(ws.quick, ws.seed, n_digits, photos)``.
    The photo ``camera`` (a dark coat against a light sky) shows the black-baseline bias
    of IG that noise baselines avoid (paper section on baselines).
    """
    stage = SaliencyStage(ws.quick, ws.seed, n_digits, photos)
    store = ws.units("saliency")
    panels = _digit_panels(ws, store, stage.digit_methods(), stage.n_digits)
    if stage.photo_names:
        panels += _photo_panels(store, stage.photo_methods(), stage.photo_names,
                                ws.progress)
    return panels
