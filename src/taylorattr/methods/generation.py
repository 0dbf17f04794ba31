"""Explaining a causal language model's answer: :func:`explain_generation`.

A Hugging Face causal LM ``p`` (any model taking ``inputs_embeds`` and returning logits,
a ``CausalLMOutput`` or a tuple) answers a prompt ``x_1..x_n`` with tokens ``t_1..t_T``
(given, or generated greedily). Row ``k`` explains

    F_k(e) = log p(t_k | x, t_<k)   (output="log_prob")   or   z_{t_k}(x, t_<k)   ("logit")

as a function of the input embeddings ``e`` of prompt and answer, read at position
``n + k - 1`` of one forward of the joined sequence (the same value as the prefix's own
forward, the model being causal), and sums each prompt token's embedding axis:
``token_attr[k, i]``; ``seq_attr = sum_k token_attr[k]`` explains ``sum_k F_k``. The
answer's tokens ``t_<k`` are held: the baseline replaces the prompt's tokens only (special
tokens stay), by ``baseline_token``.

Methods (every row of one prompt is one batched call, sample ``k`` explaining ``F_k``):

* ``"attnlrp"`` / ``"lrp"``: :class:`~taylorattr.methods.EpsilonLRP` (AttnLRP's rules on
  transformers; lxt's; explains the logit by default, as lxt);
* ``"deeplift"``: :class:`~taylorattr.methods.DeepLift`, complete:
  ``sum_i token_attr[k, i] = F_k(x) - F_k(x~)``;
* ``"ig"``: :class:`~taylorattr.methods.IntegratedGradients` (complete as ``n_steps`` grows);
* ``"taylor"``: the order-``order`` Taylor attribution
  (:func:`~taylorattr.taylor.terms.taylor_terms`, one group per token), with its
  convergence: ``convergence[k, j] = |F_k(x) - F_k(x~) - sum_{m<=j+1} P_m| / |F_k(x) -
  F_k(x~)|``, the share of the change the series leaves after order ``j + 1``. When the
  last order leaves more than ``tolerance`` of it, a :class:`CompletenessWarning` names the
  complete methods (a swap of a token's embedding is far from local: the series need not
  converge).

Padded batches: ``prompt`` may be a list of strings, or ids ``[B, L]`` with their
``attention_mask`` (left or right padding); each prompt is explained without its padding
(the same numbers as alone) and a list of results comes back.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

from ..runtime.completeness import CompletenessWarning
from ..taylor.terms import taylor_terms
from .deeplift import DeepLift
from .integrated_gradients import IntegratedGradients
from .lrp import EpsilonLRP

__all__ = ["GenerationExplanation", "explain_generation"]

METHODS = ("attnlrp", "lrp", "deeplift", "ig", "taylor")


@dataclass
class GenerationExplanation:
    """One prompt's explanation (module docstring): ``token_attr`` ``[T, n]`` (answer token
    by prompt token), ``seq_attr`` ``[n]``, the explained values ``outputs`` ``[T]`` (at the
    prompt) and ``baseline_outputs`` (at the baseline prompt; None for LRP), and for
    ``"taylor"`` ``convergence`` ``[T, order]`` and ``orders`` ``[T, order]`` (``P_k``)."""

    method: str
    output: str
    prompt_tokens: list
    answer_tokens: list
    answer_ids: torch.Tensor
    token_attr: torch.Tensor
    outputs: torch.Tensor
    baseline_outputs: torch.Tensor | None = None
    convergence: torch.Tensor | None = None
    orders: torch.Tensor | None = None

    @property
    def seq_attr(self) -> torch.Tensor:
        return self.token_attr.sum(0)

    def table(self) -> str:
        """The token attributions as text, one row per answer token."""
        width = max(len(t) for t in self.prompt_tokens + ["answer"]) + 1
        head = " " * 12 + "".join(f"{t[:width]:>{width}}" for t in self.prompt_tokens)
        rows = [f"{t[:11]:<12}" + "".join(f"{v:>{width}.3f}" for v in r.tolist())
                for t, r in zip(self.answer_tokens, self.token_attr)]
        return "\n".join([head, *rows])


class _AnswerScores(nn.Module):
    """``[B, T]``: ``F_k`` of every answer token on the joined sequence's embeddings."""

    def __init__(self, model: nn.Module, positions: torch.Tensor, tokens: torch.Tensor,
                 output: str):
        super().__init__()
        self.model, self.output = model, output
        self.training = model.training  # the user's mode (no train-mode warning on eval)
        self.register_buffer("positions", positions, persistent=False)
        self.register_buffer("tokens", tokens, persistent=False)

    def forward(self, e):
        out = self.model(inputs_embeds=e)
        logits = out.logits if hasattr(out, "logits") else out[0]
        rows = logits[:, self.positions, :]
        if self.output == "log_prob":
            rows = torch.log_softmax(rows, -1)
        return rows.gather(2, self.tokens.view(1, -1, 1).expand(rows.shape[0], -1, 1))[..., 0]


def _ids(tokenizer, text) -> list:
    return list(tokenizer(text)["input_ids"]) if callable(tokenizer) else \
        list(tokenizer.encode(text))


def _prompts(tokenizer, prompt, attention_mask) -> tuple[list, bool]:
    """The prompts as lists of ids without padding, and whether a batch was given."""
    if isinstance(prompt, str):
        return [_ids(tokenizer, prompt)], False
    if isinstance(prompt, (list, tuple)) and all(isinstance(p, str) for p in prompt):
        return [_ids(tokenizer, p) for p in prompt], True
    if isinstance(prompt, torch.Tensor) and prompt.dtype in (torch.int64, torch.int32):
        ids = prompt.view(1, -1) if prompt.dim() == 1 else prompt
        mask = torch.ones_like(ids) if attention_mask is None else attention_mask.view_as(ids)
        return [r[m.bool()].tolist() for r, m in zip(ids, mask)], prompt.dim() == 2
    raise TypeError("prompt must be a str, a list of str, or token ids [L] / [B, L] (with "
                    f"attention_mask for padded batches), got {type(prompt).__name__}")


def _answers(tokenizer, answer, n: int) -> list:
    if answer is None:
        return [None] * n
    if isinstance(answer, str):
        answer = [answer] * n if n == 1 else None
        if answer is None:
            raise ValueError("give one answer per prompt (a list of str) for a batch")
    if isinstance(answer, torch.Tensor):
        answer = [answer.view(-1)] if answer.dim() == 1 else list(answer)
    if len(answer) != n:
        raise ValueError(f"answer must give one answer per prompt ({n}), got {len(answer)}")
    out = []
    for a in answer:
        if isinstance(a, str):
            kw = {"add_special_tokens": False}
            a = tokenizer(a, **kw)["input_ids"] if callable(tokenizer) else \
                tokenizer.encode(a, **kw)
        out.append(torch.as_tensor(a, dtype=torch.long, device="cpu").view(-1).tolist())
    return out


def _generate(model, ids: list, max_new_tokens: int, tokenizer) -> list:
    if not callable(getattr(model, "generate", None)):
        raise TypeError("the model has no generate(): give answer= (a str or token ids)")
    device = model.get_input_embeddings().weight.device
    x = torch.tensor([ids], device=device)
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = pad if pad is not None else getattr(tokenizer, "eos_token_id", None)
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                             max_new_tokens=max_new_tokens, pad_token_id=pad)
    return out[0, len(ids):].tolist()


def _baseline_token(tokenizer, baseline_token) -> int:
    if baseline_token is not None:
        return int(baseline_token)
    for name in ("pad_token_id", "unk_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    return 0


def _explain_one(model, tokenizer, ids, answer, method, output, baseline_token, options):
    if not answer:
        raise ValueError("the answer is empty: nothing to explain")
    emb = model.get_input_embeddings()
    device = emb.weight.device
    n, T = len(ids), len(answer)
    joined = torch.tensor([ids + answer], device=device)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    base_ids = joined.clone()
    for i, tok in enumerate(ids):
        if tok not in special:
            base_ids[0, i] = baseline_token
    with torch.no_grad():
        e, e_base = emb(joined), emb(base_ids)
    scores = _AnswerScores(model, torch.arange(n - 1, n - 1 + T, device=device),
                           torch.tensor(answer, device=device), output)
    x, x_base = e.expand(T, -1, -1).contiguous(), e_base.expand(T, -1, -1).contiguous()
    target = torch.arange(T, device=device)
    convergence = orders = None
    if method in ("attnlrp", "lrp"):
        a = EpsilonLRP(scores, epsilon=options.get("epsilon", 1e-9)).attribute(x, target=target)
    elif method == "deeplift":
        a = DeepLift(scores).attribute(x, x_base, target=target)
    elif method == "ig":
        a = IntegratedGradients(scores).attribute(x, x_base, target=target,
                                                  n_steps=options.get("n_steps", 64))
    else:
        groups = torch.arange(n + T, device=device).view(-1, 1).expand(-1, e.shape[-1])
        terms = taylor_terms(scores, x, x_base, target, order=options.get("order", 3),
                             groups=groups)
        a, orders = terms.attribution(), terms.orders.detach()
        change = terms.output_change.detach()
        left = change.view(-1, 1) - orders.cumsum(1)
        convergence = left.abs() / change.abs().clamp_min(torch.finfo(change.dtype).tiny).view(-1, 1)
        tol = options.get("tolerance", 0.1)
        if (convergence[:, -1] > tol).any():
            worst = float(convergence[:, -1].max())
            warnings.warn(
                f"explain_generation(method='taylor'): the Taylor series of the answer's "
                f"{output} does not converge here: after order {orders.shape[1]} it leaves "
                f"{worst:.3g} of the change (remainder share per order in .convergence); the "
                "attributions do not add up to the change. Use method='ig' or "
                "method='deeplift' (complete) instead", CompletenessWarning, stacklevel=3)
    a = a.detach()
    token_attr = (a.sum(-1) if a.dim() == 3 else a)[:, :n]
    with torch.no_grad():
        outputs = scores(e)[0]
        base_out = None if method in ("attnlrp", "lrp") else scores(e_base)[0]
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    names = (lambda t: list(convert(t))) if convert else (lambda t: [str(i) for i in t])
    return GenerationExplanation(method, output, names(ids), names(answer),
                                 torch.tensor(answer, device="cpu"), token_attr, outputs, base_out,
                                 convergence, orders)


def explain_generation(model: nn.Module, tokenizer, prompt, method: str = "attnlrp", *,
                       answer=None, max_new_tokens: int = 16, output: str | None = None,
                       baseline_token: int | None = None, attention_mask=None,
                       **options):
    """Explain a causal LM's answer to ``prompt`` (module docstring).

    Args:
        model: a Hugging Face causal LM in eval mode (``inputs_embeds``, logits out).
        tokenizer: its tokenizer.
        prompt: a str, a list of str (a batch), or ids ``[L]`` / ``[B, L]`` with
            ``attention_mask`` (padding removed per prompt).
        method: ``"attnlrp"`` (= ``"lrp"``), ``"deeplift"``, ``"ig"`` or ``"taylor"``.
        answer: the answer (a str, ids, or one per prompt); None: generated greedily
            (``max_new_tokens``).
        output: ``"log_prob"`` (default; ``"logit"`` for LRP, as lxt explains it).
        baseline_token: the token the baseline puts at every non-special prompt position
            (default: the tokenizer's pad, unk or eos token).
        options: ``epsilon`` (LRP, 1e-9), ``n_steps`` (IG, 64), ``order`` (Taylor, 3),
            ``tolerance`` (Taylor's convergence warning, 0.1).

    Returns:
        a :class:`GenerationExplanation`, or a list of them for a batch of prompts.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    output = output or ("logit" if method in ("attnlrp", "lrp") else "log_prob")
    if output not in ("log_prob", "logit"):
        raise ValueError(f"output must be 'log_prob' or 'logit', got {output!r}")
    allowed = {"attnlrp": {"epsilon"}, "lrp": {"epsilon"}, "deeplift": set(),
               "ig": {"n_steps"}, "taylor": {"order", "tolerance"}}[method]
    if set(options) - allowed:
        raise TypeError(f"explain_generation(method={method!r}) takes no option(s) "
                        f"{sorted(set(options) - allowed)}; it takes {sorted(allowed)}")
    if not isinstance(model, nn.Module) or not callable(getattr(model, "get_input_embeddings",
                                                                None)):
        raise TypeError("model must be a causal LM nn.Module with get_input_embeddings() "
                        "(a Hugging Face model)")
    if model.training:
        raise ValueError("model is in train mode (dropout): call model.eval() first")
    prompts, batch = _prompts(tokenizer, prompt, attention_mask)
    answers = _answers(tokenizer, answer, len(prompts))
    base = _baseline_token(tokenizer, baseline_token)
    out = []
    for ids, ans in zip(prompts, answers):
        ans = _generate(model, ids, max_new_tokens, tokenizer) if ans is None else ans
        out.append(_explain_one(model, tokenizer, ids, ans, method, output, base, options))
    return out if batch else out[0]
