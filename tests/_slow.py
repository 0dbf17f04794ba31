"""Slow, obvious re-implementations shared by the tests as independent routes."""
import numpy as np
import torch


def slow_square_infidelity(model, x, attr, target, baseline, max_side, normalize):
    """One sample, one square at a time, numpy for the scoring."""
    scores = []
    for b in range(x.shape[0]):
        f0 = model(x[b:b + 1])[0, target[b]].item()
        preds, trues = [], []
        _, _, h, w = x.shape
        for s in range(1, max_side + 1):
            for i in range(h - s + 1):
                for j in range(w - s + 1):
                    xr = x[b:b + 1].clone()
                    xr[:, :, i:i + s, j:j + s] = baseline[b:b + 1, :, i:i + s, j:j + s]
                    preds.append(attr[b, :, i:i + s, j:j + s].sum().item())
                    trues.append(f0 - model(xr)[0, target[b]].item())
        p, t = np.array(preds), np.array(trues)
        beta = np.mean(p * t) / np.mean(p * p) if normalize else 1.0
        scores.append(np.mean((beta * p - t) ** 2))
    return torch.tensor(scores, dtype=torch.float64)
