"""
Tabular model: three estimates of the same Shapley values
=========================================================

An MLP with random weights on six features. With six players the Shapley values are
computed exactly by enumeration; KernelSHAP estimates them from 200 coalitions and
Integrated Gradients gives the path attribution. All three sum to the output change
from the baseline (the feature means).
"""
import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn

import taylorattr as ta

features = ["age", "income", "debt", "tenure", "visits", "score"]
torch.manual_seed(0)
table = torch.randn(64, 6, dtype=torch.float64)
model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1)).double().eval()
x, baseline = table[:1], table.mean(0, keepdim=True)

estimates = {
    "Shapley (exact)": ta.ShapleyValues(model).attribute(x, baselines=baseline, target=0),
    "KernelSHAP": ta.KernelShap(model).attribute(x, baselines=baseline, target=0,
                                                 n_samples=200, seed=0),
    "Integrated Gradients": ta.IntegratedGradients(model).attribute(
        x, baselines=baseline, target=0, n_steps=32),
}
with torch.no_grad():
    change = float(model(x) - model(baseline))
for name, a in estimates.items():
    print(f"{name:22s} sum {float(a.sum()):+.6f}  (f(x) - f(baseline) = {change:+.6f})")

# %%
fig, ax = plt.subplots(figsize=(7, 3))
width = 0.27
for k, (name, a) in enumerate(estimates.items()):
    ax.bar(np.arange(6) + (k - 1) * width, a[0].detach().numpy(), width, label=name)
ax.set_xticks(range(6), features)
ax.axhline(0.0, color="black", linewidth=0.5)
ax.legend(fontsize=8)
fig.tight_layout()
