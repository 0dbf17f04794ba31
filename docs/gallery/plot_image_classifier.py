"""
Image classifier: four attribution maps of one photo
====================================================

A small CNN with random weights stands in for your classifier; the photo is
scikit-image's bundled coffee cup, downsampled to 32x32. Integrated Gradients and DeepLIFT
are complete: each map sums to the change of the explained logit between the photo and
the black image.
"""
import matplotlib.pyplot as plt
import numpy as np
import torch
from skimage import data
from torch import nn

import taylorattr as ta

photo = torch.tensor(data.coffee(), dtype=torch.float32).permute(2, 0, 1) / 255.0
x = nn.functional.interpolate(photo[None], size=(32, 32), mode="area")   # [1, 3, 32, 32]

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(3, 8, 3, padding=1), nn.Softplus(), nn.AvgPool2d(2),
    nn.Conv2d(8, 8, 3, padding=1), nn.Softplus(), nn.AvgPool2d(2),
    nn.Flatten(), nn.Linear(8 * 8 * 8, 5)).eval()
target = int(model(x).argmax())

# %%
# The four methods, one call each (the same ``attribute`` contract as Captum's).
maps = {
    "Saliency": ta.Saliency(model).attribute(x, target=target),
    "Integrated Gradients": ta.IntegratedGradients(model).attribute(
        x, baselines=0.0, target=target, n_steps=32),
    "DeepLIFT": ta.DeepLift(model).attribute(x, baselines=0.0, target=target),
    "Occlusion 4x4": ta.Occlusion(model).attribute(x, baselines=0.0, target=target,
                                                   patch=4, stride=4),
}
with torch.no_grad():
    change = float(model(x)[0, target] - model(torch.zeros_like(x))[0, target])
for name in ("Integrated Gradients", "DeepLIFT"):
    print(f"{name}: sum {float(maps[name].sum()):.6f}, f(x) - f(0) = {change:.6f}")

# %%
# Each map summed over the colour channels, on its own symmetric colour scale.
fig, axes = plt.subplots(1, 5, figsize=(12, 2.8))
axes[0].imshow(x[0].permute(1, 2, 0).numpy())
axes[0].set_title("input")
for ax, (name, a) in zip(axes[1:], maps.items()):
    m = a[0].sum(0).detach().numpy()
    scale = float(np.abs(m).max()) or 1.0
    ax.imshow(m, cmap="coolwarm", vmin=-scale, vmax=scale)
    ax.set_title(name, fontsize=9)
for ax in axes:
    ax.axis("off")
fig.tight_layout()
