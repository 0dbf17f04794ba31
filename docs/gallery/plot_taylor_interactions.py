"""
Taylor interactions: what order 2 adds, and which patches interact
==================================================================

A smooth CNN (softplus) with random weights on a 16x16 crop of the coffee photo, in
sixteen 4x4 patches. ``taylor_terms`` splits the output change into first-order terms,
each patch's own higher-order terms and the interactions between patches;
``interactions`` gives every pair's exact order-2 interaction.
"""
import matplotlib.pyplot as plt
import torch
from skimage import data
from torch import nn

import taylorattr as ta

photo = torch.tensor(data.coffee(), dtype=torch.float64).permute(2, 0, 1) / 255.0
x = nn.functional.interpolate(photo[None], size=(16, 16), mode="area")   # [1, 3, 16, 16]
# the patch id of every pixel, broadcast over the colour channels: 4x4 patches, 0..15
groups = torch.arange(16).view(4, 4).repeat_interleave(4, 0).repeat_interleave(4, 1)
groups = groups.expand(3, 16, 16)

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.Softplus(), nn.AvgPool2d(4),
                      nn.Flatten(), nn.Linear(6 * 4 * 4, 3)).double().eval()

terms = ta.taylor_terms(model, x, baselines=0.0, target=0, order=2, groups=groups)
print("output change", float(terms.output_change[0]), " order-2 total", float(terms.total[0]))
print("first-order share", float(terms.first.sum()), " interactions", float(terms.interactive[0]))
pairs = ta.interactions(model, x, target=0, groups=groups, order=2)

# %%
# The first-order term of each patch and the exact order-2 interaction of every pair
# (symmetric, zero on the diagonal): neighbouring patches share the convolution's window.
fig, axes = plt.subplots(1, 3, figsize=(10, 3))
axes[0].imshow(x[0].permute(1, 2, 0).numpy())
axes[0].set_title("input (4x4 patches)")
first = terms.first[0].view(4, 4).detach().numpy()
scale = abs(first).max()
axes[1].imshow(first, cmap="coolwarm", vmin=-scale, vmax=scale)
axes[1].set_title("first-order term per patch")
pair = pairs.total(2)[0].detach().numpy()
scale = abs(pair).max()
axes[2].imshow(pair, cmap="coolwarm", vmin=-scale, vmax=scale)
axes[2].set_title("pair interactions (order 2)")
for ax in axes:
    ax.set_xticks([])
    ax.set_yticks([])
fig.tight_layout()
