"""Captum's helpers for token models and baselines: ``TokenReferenceBase``,
``InterpretableEmbeddingBase`` with ``configure_interpretable_embedding_layer`` /
``remove_interpretable_embedding_layer``, and ``ProductBaselines``.

Attributing to a token model's embeddings needs no swapped layer here: every method takes
``layer=model.embedding`` (the native ``layer=`` and ``layer_baselines``). These helpers are
for code written for Captum: ``configure_interpretable_embedding_layer(model, name)``
replaces the embedding module named ``name`` by an identity that takes the embedding
vectors, ``indices_to_embeddings(ids)`` computes them, and
``remove_interpretable_embedding_layer`` puts the original module back.
"""
from __future__ import annotations

import random
import warnings
from functools import reduce

import torch
from torch import nn

__all__ = ["InterpretableEmbeddingBase", "ProductBaselines", "TokenReferenceBase",
           "configure_interpretable_embedding_layer", "remove_interpretable_embedding_layer"]


class InterpretableEmbeddingBase(nn.Module):
    """Stands in for ``embedding``: ``forward(e)`` returns the embedding vectors ``e`` it is
    given (the first argument, or the first keyword argument);
    ``indices_to_embeddings(ids)`` is the original ``embedding(ids)``."""

    def __init__(self, embedding: nn.Module, full_name: str) -> None:
        super().__init__()
        self.num_embeddings = getattr(embedding, "num_embeddings", None)
        self.embedding_dim = getattr(embedding, "embedding_dim", None)
        self.embedding = embedding
        self.full_name = full_name

    def forward(self, *inputs, **kwargs):
        if not inputs and not kwargs:
            raise ValueError("InterpretableEmbeddingBase takes the embedding vectors as its "
                             "first argument (or first keyword argument); none was given")
        return inputs[0] if inputs else next(iter(kwargs.values()))

    def indices_to_embeddings(self, *inputs, **kwargs):
        return self.embedding(*inputs, **kwargs)


class TokenReferenceBase:
    """A reference sequence of one token: ``generate_reference(n, device)`` is
    ``[reference_token_idx] * n``."""

    def __init__(self, reference_token_idx: int = 0) -> None:
        self.reference_token_idx = reference_token_idx

    def generate_reference(self, sequence_length: int, device) -> torch.Tensor:
        return torch.tensor([self.reference_token_idx] * sequence_length, device=device)


def _owner(model: nn.Module, dotted: str):
    *path, last = dotted.split(".")
    try:
        return reduce(getattr, path, model), last
    except AttributeError as exc:
        raise ValueError(f"embedding_layer_name {dotted!r} names no module of the model") \
            from exc


def configure_interpretable_embedding_layer(model: nn.Module,
                                            embedding_layer_name: str = "embedding"):
    """Replace ``model.<embedding_layer_name>`` (dotted) by an
    :class:`InterpretableEmbeddingBase` and return it; undo with
    :func:`remove_interpretable_embedding_layer`."""
    owner, last = _owner(model, embedding_layer_name)
    layer = getattr(owner, last, None)
    if layer is None:
        raise ValueError(f"embedding_layer_name {embedding_layer_name!r} names no module of "
                         "the model")
    if type(layer) is InterpretableEmbeddingBase:
        raise ValueError(f"InterpretableEmbeddingBase has already been configured for layer "
                         f"{embedding_layer_name}; remove it first")
    warnings.warn("the embedding layer is replaced by an interpretable embedding layer that "
                  "takes embedding vectors; put the original back with "
                  "remove_interpretable_embedding_layer(model, layer) when done. (taylorattr "
                  "methods need no swap: pass layer=<the embedding module>.)", stacklevel=2)
    wrapper = InterpretableEmbeddingBase(layer, embedding_layer_name)
    setattr(owner, last, wrapper)
    return wrapper


def remove_interpretable_embedding_layer(model: nn.Module,
                                         interpretable_emb: InterpretableEmbeddingBase) -> None:
    """Put the embedding module that ``interpretable_emb`` replaced back into ``model``."""
    owner, last = _owner(model, interpretable_emb.full_name)
    setattr(owner, last, interpretable_emb.embedding)


class ProductBaselines:
    """Baselines drawn from a product of value lists: ``sample()`` (or calling it) picks one
    value of every list with ``random.choice``; for a dict ``{key: values}`` it returns
    ``{key: value}`` (a tuple key gets a tuple value, one entry per name)."""

    def __init__(self, baseline_values) -> None:
        if isinstance(baseline_values, dict):
            self.dict_keys = list(baseline_values)
            baseline_values = [baseline_values[k] for k in self.dict_keys]
        else:
            self.dict_keys = []
        self.baseline_values = baseline_values

    def sample(self):
        picked = [random.choice(values) for values in self.baseline_values]
        if not self.dict_keys:
            return picked
        out = {}
        for key, value in zip(self.dict_keys, picked):
            keys, values = (key, value) if isinstance(key, tuple) else ((key,), (value,))
            out.update(zip(keys, values))
        return out

    def __call__(self):
        return self.sample()
