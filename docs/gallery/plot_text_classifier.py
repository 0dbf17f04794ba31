"""
Text classifier: which words decided the class
==============================================

A bag-of-embeddings sentiment model with random weights. The attributions are taken on
the token embeddings (the model's first layer's output), with the zero embedding as the
baseline, and summed over the embedding dimension: one number per token.
"""
import matplotlib.pyplot as plt
import torch
from torch import nn

import taylorattr as ta

words = ["<pad>", "the", "film", "was", "not", "good", "great", "boring", "at", "all", "and"]
sentence = ["the", "film", "was", "not", "good", "at", "all"]
ids = torch.tensor([[words.index(w) for w in sentence]])


class BagOfEmbeddings(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(len(words), 8)
        self.head = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))

    def forward(self, tokens):
        return self.head(self.embedding(tokens).mean(1))


torch.manual_seed(0)
model = BagOfEmbeddings().eval()

# %%
# ``layer=model.embedding``: the attributions are those of the embedding layer's output.
ig = ta.IntegratedGradients(model, layer=model.embedding)
a = ig.attribute(ids, target=1, n_steps=32, layer_baselines=0.0)      # [1, 7, 8]
per_token = a.sum(-1)[0].detach()
print(dict(zip(sentence, per_token.tolist())))

# %%
fig, ax = plt.subplots(figsize=(7, 2.5))
ax.bar(range(len(sentence)), per_token.numpy(),
       color=["tab:red" if v < 0 else "tab:blue" for v in per_token])
ax.set_xticks(range(len(sentence)), sentence)
ax.set_ylabel("attribution to class 1")
fig.tight_layout()
