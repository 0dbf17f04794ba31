"""Small seeded models for tests/test_capture_cache.py, in a module of their own so that a
second process (the disk-cache test) builds the very same classes."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

DT = torch.float64


class SmallCNN(nn.Module):
    """Conv-act-avgpool twice, ``AdaptiveAvgPool2d(2)``, ``flatten(1)``, a linear head (the
    CNN of issue 46, average pooling so that Captum's DeepLift is complete on it: its
    ``flatten`` is a ``view`` whose size holds the batch size)."""

    def __init__(self, act: Callable[[], nn.Module] = nn.ReLU):
        super().__init__()
        self.conv1, self.act1, self.pool1 = nn.Conv2d(3, 4, 3, padding=1), act(), nn.AvgPool2d(2)
        self.conv2, self.act2, self.pool2 = nn.Conv2d(4, 6, 3, padding=1), act(), nn.AvgPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d(2)
        self.head = nn.Linear(24, 3)

    def forward(self, x):
        h = self.pool1(self.act1(self.conv1(x)))
        h = self.pool2(self.act2(self.conv2(h)))
        return self.head(self.gap(h).flatten(1))


def small_cnn(act: Callable[[], nn.Module] = nn.ReLU, seed: int = 0, dtype=DT) -> SmallCNN:
    torch.manual_seed(seed)
    return SmallCNN(act).to(dtype).eval()


def images(batch: int, seed: int = 1, dtype=DT) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, 12, 12, generator=gen, dtype=dtype)


class NextTokenLogProb(nn.Module):
    """``log p(token | e)`` of a causal LM on input embeddings ``e`` ``[B, L, d]`` (as the
    LLM front's DeepLIFT route)."""

    def __init__(self, model: nn.Module, token: int = 3):
        super().__init__()
        self.model, self.token = model, token

    def forward(self, e):
        logits = self.model(inputs_embeds=e, use_cache=False).logits
        return torch.log_softmax(logits[:, -1], -1)[:, self.token:self.token + 1]


def tiny_llama(seed: int = 0, dtype=DT):
    """A two-layer Llama of hidden size 16 (random weights), eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).to(dtype).eval()
