"""``taylorattr explain IMAGE``: saliency maps and the top-5 classes of one photo."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..registry import EG_NOISE_STD
from .saliency import SaliencyPanel, saliency_maps, saliency_methods

__all__ = ["Explanation", "explain"]


@dataclass
class Explanation:
    top5: list[tuple[str, float]]  # (class name, softmax probability)
    target: int
    panel: SaliencyPanel
    figure: Path


def _classifier(model: str, weights):
    from .. import models

    if model == "efficientnet-lite0":
        return models.efficientnet_lite0()
    return models.torchvision_model(model, weights)


def explain(image, model: str = "efficientnet-lite0", weights=None, methods=None, target=None,
            out_dir="explain", patch: int = 16, ig_steps: int = 32, eg_samples: int = 32,
            eg_noise: float = EG_NOISE_STD) -> Explanation:
    """Explain ``image`` (a path) with ``methods`` (grid labels or registry names; default all).

    Writes ``out_dir/<image stem>-saliency.png`` and returns the top-5 classes and maps.
    """
    from .. import data, plotting

    net = _classifier(model, weights)
    x = net.preprocess(data.load_image(image))
    with torch.no_grad():
        probs = torch.softmax(net(x), 1)[0]
    top = probs.topk(5)
    if target is None:
        target = int(top.indices[0])
    elif not 0 <= target < probs.shape[0]:
        raise ValueError(f"target must lie in [0, {probs.shape[0]}), got {target}")
    table = saliency_methods(patch, ig_steps, eg_samples)
    table = [m.spec.bind(m.variant, context={"patch": patch, "n_steps": ig_steps,
                                             "n_samples": eg_samples, "noise_std": eg_noise})
             for m in table]
    if methods:
        by_label = {m.label: m for m in table}
        by_name = {m.name: m for m in table}
        unknown = [m for m in methods if m not in by_label and m not in by_name]
        if unknown:
            raise ValueError(f"methods must be among {sorted(by_label)} or {sorted(by_name)}, "
                             f"got {unknown}")
        table = [by_label.get(m) or by_name[m] for m in methods]
    maps, notes = saliency_maps(net, x, target, table)
    panel = SaliencyPanel(Path(image).stem, net.unnormalize(x[0]),
                          f"{model}: {net.class_name(target)}", maps, notes)
    out = Path(out_dir)
    figure = plotting.saliency_grid([panel], out / f"{Path(image).stem}-saliency.png")
    return Explanation([(net.class_name(int(i)), float(p)) for p, i in zip(top.values, top.indices)],
                       target, panel, figure)
