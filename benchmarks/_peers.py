"""Peers loaded for the benchmarks that cannot be imported the usual way."""
from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path


def path_explainer():
    """path_explain's torch explainer, loaded from its file (its package imports TensorFlow)."""
    dist = importlib.metadata.distribution("path-explain")
    path = Path(dist.locate_file("path_explain/explainers/path_explainer_torch.py"))
    spec = importlib.util.spec_from_file_location("path_explainer_torch", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PathExplainerTorch
