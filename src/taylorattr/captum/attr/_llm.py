"""Captum's language-model front over the native methods: ``TextTokenInput``,
``TextTemplateInput``, ``LLMAttribution``, ``LLMGradientAttribution`` and
``LLMAttributionResult``.

A causal LM ``p`` explains its target tokens ``t_1..t_T`` (given, or generated greedily as
Captum generates them) after a prompt. The interpretable features are the prompt's tokens
(``TextTokenInput``) or the template's values (``TextTemplateInput``); a feature switched
off is replaced by its baseline (a token id, or a string).

``LLMAttribution`` (FeatureAblation, ShapleyValueSampling, ShapleyValues, Lime, KernelShap)
explains, per perturbation ``z`` of the features,

    F_0(z) = sum_k log p(t_k | prompt(z), t_<k),      F_k(z) = log p(t_k | prompt(z), t_<k)

(``attr_target="prob"``: their ``exp``): the sequence row ``seq_attr`` explains ``F_0``, the
rows of ``token_attr`` explain ``F_1..F_T`` (per-token rows for the ablation and Shapley
methods only, as Captum's). Each row is the Captum-compatible method (hence the native one)
on the features with that ``F_k`` as the model; the forwards are shared between the rows
(one model call per distinct perturbation) and every row sees the same random draws.

``LLMGradientAttribution`` (LayerIntegratedGradients, LayerGradientXActivation,
LayerGradientShap, and beyond Captum LayerDeepLift) attributes ``F_k`` for every ``k`` to
the layer and sums each token's trailing axis. On the input embeddings of a model that
takes ``inputs_embeds`` it attributes to the embeddings ``e`` of prompt and ``t_<k``
directly, the baseline being the embeddings of the baseline tokens (``t_<k`` kept): that
equals Captum's layer route (its layer attribution of the embedding output). On any other
layer it runs Captum's route: the layer method on the interpretable vector, the forward
mapping it to token ids. DeepLIFT (``LayerDeepLift``, input embeddings only) is complete:

    sum_i token_attr[k, i] = F_k(x) - F_k(x~),   sum_i seq_attr[i] = log p(t | x) - log p(t | x~)

with ``x~`` the prompt of baseline tokens (Captum's LLMGradientAttribution does not take
DeepLift; its DeepLift on such models is not complete).

Why one module: the inputs, the result and the two fronts share one set of conventions
(target tokens, model input, pretty tokens, the result's checks); split, the fronts and the
inputs would import each other's helpers.
"""
from __future__ import annotations

import textwrap
import warnings

import numpy as np
import torch
from torch import nn

from ...inputs import follow_mode
from .._mapping import Attribution, global_generator, not_offered
from ._gradient import (
    DeepLift,
    InputXGradient,
    IntegratedGradients,
    LayerDeepLift,
    LayerGradientShap,
    LayerGradientXActivation,
    LayerIntegratedGradients,
    Saliency,
)
from ._perturbation import FeatureAblation, KernelShap, Lime, ShapleyValueSampling

__all__ = ["InterpretableInput", "LLMAttribution", "LLMAttributionResult",
           "LLMGradientAttribution", "TextTemplateInput", "TextTokenInput"]

DEFAULT_GEN_ARGS = {"max_new_tokens": 25, "do_sample": False, "temperature": None,
                    "top_p": None}


class InterpretableInput:
    """Captum's base of interpretable inputs: ``n_itp_features`` features named ``values``;
    ``to_tensor()`` is the all-on vector ``[1, n]``; ``to_model_input(z)`` the model input
    with the features ``z == 0`` (``!= 1`` for tokens) replaced by their baselines;
    ``format_attr`` maps interpretable attributions back to the input's features."""

    n_itp_features: int
    values: list

    def to_tensor(self) -> torch.Tensor:
        raise NotImplementedError

    def to_model_input(self, perturbed_tensor=None):
        raise NotImplementedError

    def format_attr(self, itp_attr: torch.Tensor) -> torch.Tensor:
        return itp_attr


class TextTemplateInput(InterpretableInput):
    """A prompt ``template.format(*values)`` (or ``**values`` for a dict; ``template`` may be
    a callable) whose values are the features; a value switched off becomes its baseline
    (``""`` by default; a list, a dict, or a callable drawn at every perturbation).
    ``mask`` groups values into one feature each."""

    def __init__(self, template, values, baselines=None, mask=None) -> None:
        if isinstance(values, dict):
            self.dict_keys = list(values)
            values = [values[k] for k in self.dict_keys]
        elif isinstance(values, list):
            self.dict_keys = []
        else:
            raise TypeError(f"values must be a list or a dict, got {type(values).__name__}")
        self.values = values
        if baselines is None:
            baselines = [""] * len(values)
        elif not callable(baselines):
            if self.dict_keys:
                if not isinstance(baselines, dict):
                    raise TypeError("baselines must be a dict (or a callable returning one) "
                                    f"when values is a dict, got {type(baselines).__name__}")
                baselines = [baselines[k] for k in self.dict_keys]
            elif not isinstance(baselines, list):
                raise TypeError("baselines must be a list (or a callable returning one) when "
                                f"values is a list, got {type(baselines).__name__}")
        self.baselines = baselines
        if mask is None:
            n_itp = len(values)
        else:
            if self.dict_keys:
                if not isinstance(mask, dict):
                    raise TypeError("mask must be a dict when values is a dict, got "
                                    f"{type(mask).__name__}")
                mask = [mask[k] for k in self.dict_keys]
            ids = set(mask)  # Captum's numbering: the set's order
            index = {m: i for i, m in enumerate(ids)}
            self.formatted_mask = [index[m] for m in mask]
            n_itp = len(ids)
        self.n_features, self.n_itp_features = len(values), n_itp
        self.template = template
        if isinstance(template, str):
            self.format_fn = template.format
        elif callable(template):
            self.format_fn = template
        else:
            raise TypeError(f"template must be a str or a callable, got "
                            f"{type(template).__name__}")
        self.mask = mask

    def to_tensor(self) -> torch.Tensor:
        return torch.tensor([[1.0] * self.n_itp_features], device="cpu")

    def _baselines(self) -> list:
        if not callable(self.baselines):
            return self.baselines
        drawn = self.baselines()
        if self.dict_keys:
            if not isinstance(drawn, dict):
                raise TypeError("baselines() must return a dict when values is a dict")
            return [drawn[k] for k in self.dict_keys]
        if not isinstance(drawn, list):
            raise TypeError("baselines() must return a list when values is a list")
        return drawn

    def to_model_input(self, perturbed_tensor=None) -> str:
        values = list(self.values)
        if perturbed_tensor is not None:
            base = self._baselines()
            for i in range(len(values)):
                j = self.formatted_mask[i] if self.mask else i
                if not perturbed_tensor[0][j]:
                    values[i] = base[i]
        if self.dict_keys:
            return self.format_fn(**dict(zip(self.dict_keys, values)))
        return self.format_fn(*values)

    def format_attr(self, itp_attr: torch.Tensor) -> torch.Tensor:
        if self.mask is None:
            return itp_attr
        return itp_attr[..., torch.tensor(self.formatted_mask, device=itp_attr.device)]


class TextTokenInput(InterpretableInput):
    """A prompt's tokens as the features (``tokenizer.encode(text)``, special tokens
    included), but for ``skip_tokens`` (ids or token strings), which stay; a token switched
    off becomes ``baselines`` (a token id, or a token string)."""

    def __init__(self, text: str, tokenizer, baselines=0, skip_tokens=None) -> None:
        ids = tokenizer.encode(text, return_tensors="pt")
        self.inp_tensor = self.itp_tensor = ids
        self.itp_mask = None
        if skip_tokens:
            if isinstance(skip_tokens[0], str):
                skip_tokens = tokenizer.convert_tokens_to_ids(skip_tokens)
            self.itp_mask = ~torch.isin(ids, torch.tensor(list(skip_tokens), device=ids.device))
            self.itp_tensor = ids[self.itp_mask].unsqueeze(0)
        self.skip_tokens = skip_tokens
        self.values = tokenizer.convert_ids_to_tokens(self.itp_tensor[0].tolist())
        self.tokenizer = tokenizer
        self.n_itp_features = len(self.values)
        self.baselines = baselines if type(baselines) is int else \
            tokenizer.convert_tokens_to_ids([baselines])[0]

    def to_tensor(self) -> torch.Tensor:
        return torch.ones_like(self.itp_tensor)

    def to_model_input(self, perturbed_tensor=None) -> torch.Tensor:
        if perturbed_tensor is None:
            return self.inp_tensor
        device = perturbed_tensor.device
        shape = (perturbed_tensor.shape[0], -1)
        itp = self.itp_tensor.expand(*shape).clone().to(device)
        itp[perturbed_tensor != 1] = self.baselines
        if self.itp_mask is None:
            return itp
        full = self.inp_tensor.expand(*shape).clone().to(device)
        full[self.itp_mask.expand(*shape).to(device)] = itp.reshape(-1)
        return full


class LLMAttributionResult:
    """Captum's result: ``seq_attr`` ``[n]`` (the features' attribution of the whole target),
    ``token_attr`` ``[T, n]`` (per target token) or None, ``input_tokens``,
    ``output_tokens``; ``plot_token_attr`` / ``plot_seq_attr`` draw them."""

    def __init__(self, *, input_tokens, output_tokens, seq_attr, token_attr=None,
                 output_probs=None, inp=None) -> None:
        self.input_tokens, self.output_tokens, self.inp = input_tokens, output_tokens, inp
        self.seq_attr, self.token_attr, self.output_probs = seq_attr, token_attr, output_probs

    @property
    def seq_attr(self) -> torch.Tensor:
        return self._seq_attr

    @seq_attr.setter
    def seq_attr(self, value) -> None:
        value = torch.as_tensor(value, device=getattr(value, "device", "cpu"))
        if value.dim() != 1 or value.shape[0] != len(self.input_tokens):
            raise ValueError(f"seq_attr must be 1-D with one value per input token "
                             f"({len(self.input_tokens)}), got shape {tuple(value.shape)}")
        self._seq_attr = value

    @property
    def token_attr(self):
        return self._token_attr

    @token_attr.setter
    def token_attr(self, value) -> None:
        value = None if value is None else torch.as_tensor(value, device=getattr(value, "device", "cpu"))
        want = (len(self.output_tokens), len(self.input_tokens))
        if value is not None and tuple(value.shape) != want:
            raise ValueError(f"token_attr must have shape {want} (output x input tokens), got "
                             f"{tuple(value.shape)}")
        self._token_attr = value

    @property
    def output_probs(self):
        return self._output_probs

    @output_probs.setter
    def output_probs(self, value) -> None:
        value = None if value is None else torch.as_tensor(value, device=getattr(value, "device", "cpu"))
        if value is not None and (value.dim() != 1 or value.shape[0] != len(self.output_tokens)):
            raise ValueError("output_probs must be 1-D with one value per output token")
        self._output_probs = value

    @property
    def seq_attr_dict(self) -> dict:
        return {k: v for v, k in zip(self.seq_attr.cpu().tolist(), self.input_tokens)}

    @staticmethod
    def _cmap():
        from matplotlib.colors import LinearSegmentedColormap
        return LinearSegmentedColormap.from_list("RdWhGn", ["red", "white", "green"])

    @staticmethod
    def _labels(tokens) -> list:
        return [textwrap.shorten(repr(t)[1:-1], width=50, placeholder="...") for t in tokens]

    def plot_token_attr(self, show: bool = False):
        """Heat map of ``token_attr`` (output tokens down, input tokens across), the values
        written in the cells; ``(figure, axis)`` unless ``show``."""
        if self.token_attr is None:
            raise ValueError("token_attr is None (no token-level attribution was performed); "
                             "use plot_seq_attr for the sequence-level attribution")
        import matplotlib.pyplot as plt

        data = self.token_attr.cpu().double().numpy()
        top = float(np.abs(data).max())
        fig, ax = plt.subplots()
        ax.grid(False)
        fig.set_size_inches(max(data.shape[1] * 1.3, 6.4), max(data.shape[0] / 2.5, 4.8))
        im = ax.imshow(data, vmax=top, vmin=-top, cmap=self._cmap(), aspect="auto")
        fig.set_facecolor("white")
        fig.colorbar(im, ax=ax).ax.set_ylabel("Token Attribution", rotation=-90, va="bottom")
        ax.set_xticks(np.arange(data.shape[1]), labels=self._labels(self.input_tokens))
        ax.set_yticks(np.arange(data.shape[0]),
                      labels=[repr(t)[1:-1] for t in self.output_tokens])
        ax.tick_params(top=True, bottom=False, labeltop=True, labelbottom=False)
        plt.setp(ax.get_xticklabels(), rotation=-30, ha="right", rotation_mode="anchor")
        for i in range(data.shape[0]):
            for j in range(data.shape[1]):
                v = data[i, j]
                ax.text(j, i, f"{v:.4f}", ha="center", va="center",
                        color="black" if 0.2 < im.norm(v) < 0.8 else "white")
        if show:
            plt.show()
            return None
        return fig, ax

    def plot_seq_attr(self, show: bool = False):
        """Bar chart of ``seq_attr`` (positive blue, negative red)."""
        import matplotlib.pyplot as plt

        data = self.seq_attr.cpu().double().numpy()
        fig, ax = plt.subplots()
        fig.set_size_inches(max(data.shape[0] / 2, 6.4), max(data.shape[0] / 4, 4.8))
        ax.set_xticks(range(data.shape[0]), labels=self._labels(self.input_tokens))
        ax.tick_params(top=True, bottom=False, labeltop=True, labelbottom=False)
        plt.setp(ax.get_xticklabels(), rotation=-30, ha="right", rotation_mode="anchor")
        fig.set_facecolor("white")
        ax.bar(range(data.shape[0]), np.maximum(data, 0), align="center", color="#4772b3")
        ax.bar(range(data.shape[0]), np.minimum(data, 0), align="center", color="#d0365b")
        ax.set_ylabel("Sequence Attribution", rotation=90, va="bottom")
        if show:
            plt.show()
            return None
        return fig, ax

    def plot_image_heatmap(self, *args, **kwargs):
        raise not_offered("plot_image_heatmap", "image inputs (ImageMaskInput) are not "
                          "offered; instead: visualization.visualize_image_attr")


def _pretty_tokens(ids: torch.Tensor, tokenizer) -> list:
    """The target's tokens as text, Captum's way: the spans of the decoded text that the
    tokens cover (``"\\n"`` written out, stripped; a span overlapping the one before marked
    ``" [OVERLAP]"``); token by token when the text does not encode back to ``ids``."""
    ids = torch.as_tensor(ids, device=getattr(ids, "device", "cpu")).reshape(-1)
    text = tokenizer.decode(ids)
    want = ids.tolist()
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    got, offsets = enc["input_ids"], enc["offset_mapping"]
    spans = [(s, e if s != e else (offsets[i + 1][0] if i + 1 < len(offsets) else len(text)))
             for i, (s, e) in enumerate(offsets)]
    pretty, end_prev, idx = [], -1, 0
    for i, (s, e) in enumerate(spans):
        if idx >= len(want) or got[i] != want[idx]:
            continue
        pretty.append(text[s:e].replace("\n", "\\n").strip() +
                      (" [OVERLAP]" if end_prev > s else ""))
        end_prev, idx = e, idx + 1
    if len(pretty) == len(want):
        return pretty
    warnings.warn("the target's text does not encode back to its tokens; each token is "
                  "decoded on its own", stacklevel=3)
    return [tokenizer.decode(i).replace("\n", "\\n").strip() for i in ids]


class _LLMBase(Attribution):
    _methods: tuple = ()
    _inputs: tuple = ()

    def __init__(self, attr_method, tokenizer) -> None:
        if not isinstance(attr_method, self._methods):
            raise TypeError(f"{type(self).__name__} takes one of "
                            f"{[c.__name__ for c in self._methods]} (from "
                            f"taylorattr.captum.attr), got {type(attr_method).__name__}")
        super().__init__(attr_method.forward_func)
        self.attr_method = attr_method
        self.model = attr_method.forward_func
        self.tokenizer = tokenizer
        self.device = getattr(self.model, "device", None) or \
            next(self.model.parameters()).device

    def _target_tokens(self, inp, target, gen_args) -> torch.Tensor:
        if not isinstance(inp, self._inputs):
            raise TypeError(f"{type(self).__name__} takes inputs of "
                            f"{[c.__name__ for c in self._inputs]}, got {type(inp).__name__}")
        if target is None:
            if not callable(getattr(self.model, "generate", None)):
                raise ValueError("the model has no generate(); give target (a str or token "
                                 "ids) to explain")
            model_inp = self._model_input(inp.to_model_input())
            model_inp.setdefault("attention_mask", torch.ones_like(model_inp["input_ids"]))
            gen_args = dict(gen_args or DEFAULT_GEN_ARGS)
            if getattr(self.tokenizer, "pad_token_id", None) is not None:
                gen_args.setdefault("pad_token_id", self.tokenizer.pad_token_id)
            out = self.model.generate(**model_inp, **gen_args)
            return out[0][model_inp["input_ids"].shape[1]:]
        if gen_args is not None:
            raise ValueError("gen_args is for generating the target: give it only without "
                             "target")
        if isinstance(target, str):
            return torch.tensor(self.tokenizer.encode(target, add_special_tokens=False), device="cpu")
        if isinstance(target, torch.Tensor):
            return target
        raise TypeError(f"target must be a str or a tensor of token ids, got "
                        f"{type(target).__name__}")

    def _model_input(self, model_input) -> dict:
        if isinstance(model_input, str):
            model_input = self.tokenizer.encode(model_input, return_tensors="pt")
        if isinstance(model_input, torch.Tensor):
            return {"input_ids": model_input.to(self.device)}
        return dict(model_input)

    def attribute_future(self, *args, **kwargs):
        raise NotImplementedError(f"attribute_future is not implemented for "
                                  f"{type(self).__name__}")


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    return logits[:, 0] if logits.dim() == 4 else logits


def _sequence_log_probs(model, input_ids: torch.Tensor, target: torch.Tensor,
                        in_tokens: bool = False) -> torch.Tensor:
    """``log p(t_k | input, t_<k)`` for every target token, ``[T]``: one forward of the
    joined sequence, or (``in_tokens``, Captum's default) one forward per target token on
    the prefix before it (the same for a causal model; a model that looks ahead sees only
    the prefix)."""
    target = target.to(input_ids.device)
    joined = torch.cat([input_ids, target.view(1, -1)], 1)
    n, t = input_ids.shape[1], target.shape[0]
    if in_tokens:
        rows = torch.stack([_logits(model, joined[:, :n + k])[0, -1] for k in range(t)])
    else:
        rows = _logits(model, joined)[0, n - 1:n - 1 + t]
    return torch.log_softmax(rows, -1)[torch.arange(t, device=rows.device), target]


class _Outputs:
    """``[F_0, F_1, ..., F_T]`` of every perturbation, each perturbation's forward run once
    (kept by the perturbation's values)."""

    def __init__(self, owner, inp, target, per_token: bool, inspect=None,
                 in_tokens: bool = True):
        self.owner, self.inp, self.target, self.per_token = owner, inp, target, per_token
        self.inspect, self.in_tokens, self.seen = inspect, in_tokens, {}

    def row(self, z: torch.Tensor) -> torch.Tensor:
        key = tuple(z.tolist())
        if key not in self.seen:
            prompt, logp = self.owner._target_log_probs(self.inp, z.view(1, -1), self.target,
                                                        self.in_tokens)
            values = torch.cat([logp.sum().view(1), logp]) if self.per_token else \
                logp.sum().view(1)
            values = values if self.owner.attr_target == "log_prob" else values.exp()
            if self.inspect is not None:
                self.inspect(prompt,
                             self.owner.tokenizer.decode(self.target),
                             values.exp().tolist() if self.owner.attr_target == "log_prob"
                             else values.tolist())
            self.seen[key] = values
        return self.seen[key]

    def column(self, k: int):
        def forward(z):
            return torch.stack([self.row(r)[k] for r in z.reshape(z.shape[0], -1)])
        return forward


def _taken(function, kwargs: dict) -> dict:
    """The keyword arguments ``function`` names; a warning names the others, which are left
    out (a ``**kwargs`` of a Captum-compatible method takes none beyond Captum's names)."""
    import inspect

    params = {n for n, p in inspect.signature(function).parameters.items()
              if p.kind is not p.VAR_KEYWORD}
    left = sorted(set(kwargs) - params)
    if left:
        warnings.warn(f"{function.__qualname__} does not take {left}; they are left out",
                      stacklevel=3)
    return {k: v for k, v in kwargs.items() if k in params}


def _same_method(method, forward_func):
    """``method``'s class on ``forward_func`` with ``method``'s settings: every constructor
    argument after ``forward_func`` read from the attribute of its name (Captum's classes
    keep them so: ``interpretable_model``, ``similarity_func``, ``perm_func``, ...); an
    interpretable model is cloned unfitted, so each row fits its own copy."""
    import copy
    import inspect

    params = list(inspect.signature(type(method).__init__).parameters)[2:]
    kwargs = {n: getattr(method, n) for n in params if hasattr(method, n)}
    if kwargs.get("interpretable_model") is not None:
        kwargs["interpretable_model"] = copy.deepcopy(kwargs["interpretable_model"])
    return type(method)(forward_func, **kwargs)


class LLMAttribution(_LLMBase):
    """Captum's ``LLMAttribution`` over the Captum-compatible perturbation methods (module
    docstring): ``attribute(inp, target=None, num_trials=1, gen_args=None, **kwargs)``, the
    keyword arguments passed to the method's ``attribute`` (e.g. ``n_samples``)."""

    def __init__(self, attr_method, tokenizer, attr_target: str = "log_prob") -> None:
        self._methods = (FeatureAblation, ShapleyValueSampling, Lime, KernelShap)
        self._inputs = (TextTemplateInput, TextTokenInput)
        super().__init__(attr_method, tokenizer)
        self.include_per_token_attr = isinstance(attr_method,
                                                 (FeatureAblation, ShapleyValueSampling))
        if attr_target not in ("log_prob", "prob"):
            raise ValueError(f"attr_target must be 'log_prob' or 'prob', got {attr_target!r}")
        self.attr_target = attr_target

    def _target_log_probs(self, inp, z, target, in_tokens: bool):
        """The prompt (as text) of the perturbation ``z`` and ``log p(t_k | prompt, t_<k)``
        of every target token."""
        ids = self._model_input(inp.to_model_input(z))["input_ids"]
        return self.tokenizer.decode(ids[0]), _sequence_log_probs(self.model, ids, target,
                                                                  in_tokens)

    def attribute(self, inp, target=None, num_trials: int = 1, gen_args=None,
                  use_cached_outputs: bool = True, _inspect_forward=None,
                  forward_in_tokens: bool = True, **kwargs) -> LLMAttributionResult:
        """``forward_in_tokens`` (Captum's default): one forward per target token on the
        prefix before it; otherwise one forward of the joined sequence (the same for a
        causal model). ``use_cached_outputs`` is not used: the forwards run without a
        key-value cache (Captum's cached path gives other log-probabilities under
        transformers 5). Keyword arguments the method's ``attribute`` does not take are left
        out with a warning (Captum's methods swallow them)."""
        target_tokens = self._target_tokens(inp, target, gen_args)
        rows = 1 + len(target_tokens) if self.include_per_token_attr else 1
        total = torch.zeros(rows, inp.n_itp_features, dtype=torch.float, device=self.device)
        kwargs = _taken(type(self.attr_method).attribute, kwargs)
        # ablation and Shapley sampling take differences of the outputs in their own dtype
        # (Captum's too, rounded to float32 at the end); Lime and KernelShap fit in the
        # interpretable vector's float32, as Captum's fits do
        z_dtype = torch.float64 if self.include_per_token_attr else torch.float32
        for _ in range(num_trials):
            outputs = _Outputs(self, inp, target_tokens, self.include_per_token_attr,
                               _inspect_forward, forward_in_tokens)
            z = inp.to_tensor().to(self.device, z_dtype)
            gen = global_generator()  # where Captum draws: the default device's generator
            torch_state, np_state = gen.get_state(), np.random.get_state()
            for k in range(rows):  # every row sees the draws Captum makes once
                gen.set_state(torch_state)
                np.random.set_state(np_state)
                method = _same_method(self.attr_method, outputs.column(k))
                total[k] += method.attribute(z, **kwargs).reshape(-1).to(total.dtype)
        attr = inp.format_attr(total / num_trials)
        return LLMAttributionResult(
            seq_attr=attr[0], token_attr=attr[1:] if self.include_per_token_attr else None,
            input_tokens=inp.values, output_tokens=_pretty_tokens(target_tokens,
                                                                  self.tokenizer), inp=inp)


class _TokenLogProb(nn.Module):
    """``log p(t | e)``: the causal LM on input embeddings ``e`` ``[B, L, d]``, the
    log-probability of token ``t`` next."""

    def __init__(self, model: nn.Module, token: int) -> None:
        super().__init__()
        self.model, self.token = model, token
        follow_mode(self, model)

    def forward(self, e):
        logits = self.model(inputs_embeds=e).logits
        if logits.dim() == 4:
            logits = logits[:, 0]
        return torch.log_softmax(logits[:, -1], -1)[:, self.token]


class _PromptLogProb(nn.Module):
    """Captum's route: ``log p(t_k | prompt(z), t_<k)`` as a function of the interpretable
    vector ``z`` ``[R, n]`` (the prompt's ids from ``inp.to_model_input(z)``), so that a
    layer method attributes to any layer of the model."""

    def __init__(self, owner, inp, target: torch.Tensor, k: int) -> None:
        super().__init__()
        self.model, self.owner, self.inp, self.target, self.k = owner.model, owner, inp, target, k
        follow_mode(self, owner.model)

    def forward(self, z):
        ids = self.owner._model_input(self.inp.to_model_input(z))["input_ids"]
        if self.k:
            before = self.target[:self.k].view(1, -1).expand(ids.shape[0], -1)
            ids = torch.cat([ids, before.to(ids.device)], 1)
        logits = self.model(ids).logits
        if logits.dim() == 4:
            logits = logits[:, 0]
        return torch.log_softmax(logits[:, -1], -1)[:, int(self.target[self.k])]


class LLMGradientAttribution(_LLMBase):
    """Captum's ``LLMGradientAttribution`` on the input embeddings (module docstring):
    LayerIntegratedGradients and LayerGradientXActivation as Captum; LayerDeepLift (complete)
    beyond Captum. ``attribute(inp, target=None, gen_args=None,
    **kwargs)``, the keyword arguments passed to the method (e.g. ``n_steps``)."""

    def __init__(self, attr_method, tokenizer) -> None:
        self._methods = (LayerIntegratedGradients, LayerGradientXActivation, LayerGradientShap,
                         LayerDeepLift)
        self._inputs = (TextTokenInput,)
        super().__init__(attr_method, tokenizer)
        embeddings = getattr(self.model, "get_input_embeddings", lambda: None)()
        # the input embeddings of a model that takes inputs_embeds: attribute there directly
        self.embeddings = embeddings if attr_method.layer is embeddings and \
            not isinstance(attr_method, LayerGradientShap) else None
        if self.embeddings is None and isinstance(attr_method, LayerDeepLift):
            raise not_offered("LLMGradientAttribution(LayerDeepLift) on a layer other than "
                              "the input embeddings", "pass layer=model.get_input_embeddings() "
                              "of a model that takes inputs_embeds")

    def _layer_route(self, inp, target_tokens, kwargs) -> torch.Tensor:
        """Captum's route: the layer method on the interpretable vector, for every target
        token, the layer's trailing axis summed and the appended target positions cut."""
        m = self.attr_method
        z = inp.to_tensor().to(self.device)
        rows = []
        for k in range(len(target_tokens)):
            f = _PromptLogProb(self, inp, target_tokens, k)
            method = type(m)(f, m.layer, multiply_by_inputs=m.multiplies_by_inputs)
            a = method.attribute(z, **kwargs)
            a = a[0] if isinstance(a, tuple) else a
            a = a.detach()
            rows.append((a[:, :-k] if k else a).sum(-1))
        return torch.cat(rows, 0)

    def _explain(self, model, e, base, kwargs) -> torch.Tensor:
        m, mult = self.attr_method, self.attr_method.multiplies_by_inputs
        if isinstance(m, LayerIntegratedGradients):
            return IntegratedGradients(model, mult).attribute(e, base, **kwargs)
        if isinstance(m, LayerDeepLift):
            return DeepLift(model, mult).attribute(e, base, **kwargs)
        if mult:
            return InputXGradient(model).attribute(e, **kwargs)
        return Saliency(model).attribute(e, abs=False, **kwargs)

    def _embedding_route(self, inp, target_tokens, kwargs) -> torch.Tensor:
        """The method on ``inputs_embeds`` for every target token (module docstring);
        ``baselines`` (optional) in the interpretable space: 0 switches a token off."""
        on = inp.to_tensor().to(self.device)
        off = kwargs.pop("baselines", None)
        off = torch.zeros_like(on) if off is None else torch.as_tensor(off, device=on.device).expand_as(on)
        ids = self._model_input(inp.to_model_input(on))["input_ids"]
        base_ids = self._model_input(inp.to_model_input(off.to(on.dtype)))["input_ids"]
        rows = []
        for k in range(len(target_tokens)):
            before = target_tokens[:k].view(1, -1)
            with torch.no_grad():
                e = self.embeddings(torch.cat([ids, before], 1))
                base = self.embeddings(torch.cat([base_ids, before], 1))
            a = self._explain(_TokenLogProb(self.model, int(target_tokens[k])), e, base,
                              dict(kwargs)).detach()
            rows.append(a[:, :ids.shape[1]].sum(-1))
        return torch.cat(rows, 0)

    def attribute(self, inp, target=None, gen_args=None, **kwargs) -> LLMAttributionResult:
        """Rows: the target tokens; columns: the prompt's explained tokens."""
        target_tokens = self._target_tokens(inp, target, gen_args).to(self.device)
        route = self._layer_route if self.embeddings is None else self._embedding_route
        kwargs = _taken(type(self.attr_method).attribute, kwargs)
        attr = route(inp, target_tokens, dict(kwargs))
        if inp.itp_mask is not None:
            attr = attr[inp.itp_mask.to(attr.device).expand_as(attr)].view(attr.shape[0], -1)
        return LLMAttributionResult(seq_attr=attr.sum(0), token_attr=attr,
                                    input_tokens=inp.values,
                                    output_tokens=_pretty_tokens(target_tokens.cpu(),
                                                                 self.tokenizer))
