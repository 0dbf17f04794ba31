"""Captum's general LIME: ``LimeBase``, the exponential-kernel similarity
(``get_exp_kernel_similarity_function``) and ``Lime`` with a user's interpretable model,
similarity or perturbation function (:func:`general_lime`).

LIME fits an interpretable model ``g`` to the model on ``n_samples`` perturbations ``z``
of the interpretable features, each weighted by its similarity ``pi(x, z)``:

    g = argmin_g sum_z pi(x, z) (f(h(z)) - g(z))^2 + Omega(g)

with ``h`` the map from the interpretable space to the model's inputs. The model ``g``
follows Captum's interface: ``fit(data_loader)`` over one batch ``(z, f(h(z)), pi)`` and
``representation()`` its coefficients (Captum's ``SkLearnLasso``, ``SGDLasso``, or any
object with those two methods). Lime's default (uniform coalitions, cosine kernel of width
1, ``Lasso(alpha=0.01)``) runs natively (:class:`~taylorattr.captum.attr.Lime`); this
module runs the general framework, drawing as Captum draws (the perturbation function,
then the similarity, sample by sample).
"""
from __future__ import annotations

import inspect
import math
import sys
import warnings

import torch
from torch.nn import CosineSimilarity
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

from .._mapping import PerturbationAttribution

__all__ = ["LimeBase", "SkLearnLassoModel", "default_from_interp_rep_transform",
           "default_perturb_func", "general_lime", "get_exp_kernel_similarity_function"]


def _flat(value) -> torch.Tensor:
    parts = value if isinstance(value, tuple) else (value,)
    return torch.cat([p.reshape(-1) for p in parts])


def get_exp_kernel_similarity_function(distance_mode: str = "cosine",
                                       kernel_width: float = 1.0):
    """``pi(x, z) = exp(-d(x, h(z))^2 / (2 width^2))``, ``d`` the cosine distance
    ``1 - cos(x, h(z))`` or the Euclidean one of the flattened inputs (Captum's)."""
    if distance_mode not in ("cosine", "euclidean"):
        raise ValueError(f"distance_mode must be 'cosine' or 'euclidean', got "
                         f"{distance_mode!r}")

    def similarity(original_inp, perturbed_inp, _interpretable, **kwargs) -> float:
        a, b = _flat(original_inp).float(), _flat(perturbed_inp).float()
        if distance_mode == "cosine":
            distance = 1 - CosineSimilarity(dim=0)(a, b)
        else:
            distance = torch.norm(a - b)
        return math.exp(-1 * (distance ** 2) / (2 * kernel_width ** 2))
    return similarity


def default_perturb_func(original_inp, **kwargs) -> torch.Tensor:
    """A uniform coalition ``[1, n]`` (each feature on with probability 1/2), drawn on the
    default device as Captum draws it."""
    if "num_interp_features" not in kwargs:
        raise ValueError("default_perturb_func needs num_interp_features")
    device = (original_inp if isinstance(original_inp, torch.Tensor) else original_inp[0]).device
    probs = torch.ones(1, int(kwargs["num_interp_features"]), device=torch.get_default_device()) * 0.5
    return torch.bernoulli(probs).to(device=device).long()


def default_from_interp_rep_transform(curr_sample, original_inputs, **kwargs):
    """``h(z)``: a feature on keeps the input, off takes the baseline (``feature_mask`` and
    ``baselines`` in ``kwargs``)."""
    if "feature_mask" not in kwargs or "baselines" not in kwargs:
        raise ValueError("the default interpretable transform needs feature_mask and "
                         "baselines")
    masks, bases = kwargs["feature_mask"], kwargs["baselines"]
    one = isinstance(masks, torch.Tensor)
    masks = (masks,) if one else masks
    bases = (bases,) if one else bases
    inputs = (original_inputs,) if one else original_inputs
    out = tuple(curr_sample[0][m].bool().to(x.dtype) * x
                + (~curr_sample[0][m].bool()).to(x.dtype) * b
                for m, x, b in zip(masks, inputs, bases))
    return out[0] if one else out


def _expand(value, n: int):
    """Additional forward arguments for ``n`` stacked copies (tensors repeated)."""
    if value is None:
        return None
    parts = value if isinstance(value, tuple) else (value,)
    out = tuple(torch.cat([p] * n) if isinstance(p, torch.Tensor) else p for p in parts)
    return out if isinstance(value, tuple) else out[0]


def _expand_target(target, n: int):
    if isinstance(target, list):
        return target * n
    if isinstance(target, torch.Tensor) and target.numel() > 1:
        return torch.cat([target] * n)
    return target


def _select(out, target):
    if not isinstance(out, torch.Tensor) or target is None:
        return out
    if isinstance(target, torch.Tensor) and target.numel() == 1:
        target = int(target)
    if isinstance(target, int):
        return out[:, target]
    if isinstance(target, tuple):
        return out[(slice(None),) + target]
    index = torch.as_tensor(target, device=out.device).long().view(-1, 1)
    return out.gather(1, index).squeeze(1)


class SkLearnLassoModel:
    """Captum's default interpretable model, scikit-learn's ``Lasso(alpha)``, in Captum's
    interface: ``fit`` on the one batch (sample weights the similarities),
    ``representation()`` the coefficients ``[1, n]``, drawing from the global generator as
    Captum's ``SkLearnLasso`` does."""

    def __init__(self, alpha: float = 0.01):
        self.alpha, self.coef = alpha, None

    def fit(self, loader) -> None:
        from sklearn.linear_model import Lasso

        x, y, w = next(iter(loader))
        model = Lasso(alpha=self.alpha).fit(x.float().cpu().numpy(), y.float().cpu().numpy(),
                                            sample_weight=w.float().cpu().numpy())
        self.coef = torch.as_tensor(model.coef_, dtype=torch.float32, device="cpu").reshape(1, -1)
        # Captum's model then holds its coefficients in an nn.Linear, whose initialisation
        # draws from the global generator: the same draws, so that later samples match
        torch.nn.Linear(x.shape[1], 1 if y.dim() == 1 else y.shape[1],
                        device=torch.get_default_device())

    def representation(self) -> torch.Tensor:
        return self.coef


class LimeBase(PerturbationAttribution):
    """Captum's ``LimeBase`` (module docstring): ``perturb_func(inputs, **kwargs)`` draws
    a sample (a function or a generator), in the interpretable space
    (``perturb_interpretable_space``, mapped by ``from_interp_rep_transform``) or the
    input space (mapped back by ``to_interp_rep_transform``); ``similarity_func(inputs,
    model_input, interpretable_sample, **kwargs)`` weighs it; ``attribute`` returns
    ``interpretable_model.representation()`` after the fit."""

    def __init__(self, forward_func, interpretable_model, similarity_func, perturb_func,
                 perturb_interpretable_space: bool, from_interp_rep_transform,
                 to_interp_rep_transform) -> None:
        super().__init__(forward_func)
        self.interpretable_model, self.similarity_func = interpretable_model, similarity_func
        self.perturb_func = perturb_func
        self.perturb_interpretable_space = perturb_interpretable_space
        self.from_interp_rep_transform = from_interp_rep_transform
        self.to_interp_rep_transform = to_interp_rep_transform
        if perturb_interpretable_space and from_interp_rep_transform is None:
            raise ValueError("give from_interp_rep_transform to perturb in the "
                             "interpretable space")
        if not perturb_interpretable_space and to_interp_rep_transform is None:
            raise ValueError("give to_interp_rep_transform to perturb in the input space")

    def _sampler(self, inputs, kwargs):
        gen = self.perturb_func(inputs, **kwargs) if \
            inspect.isgeneratorfunction(self.perturb_func) else None

        def draw():
            sample = next(gen) if gen is not None else self.perturb_func(inputs, **kwargs)
            if self.perturb_interpretable_space:
                return sample, self.from_interp_rep_transform(sample, inputs, **kwargs)
            return self.to_interp_rep_transform(sample, inputs, **kwargs), sample
        return draw

    def _evaluate(self, model_inputs: list, target, extra):
        n = len(model_inputs)
        if isinstance(model_inputs[0], tuple):
            batch = tuple(torch.cat(parts) for parts in zip(*model_inputs))
        else:
            batch = (torch.cat(model_inputs),)
        extra = _expand(extra, n)
        extra = () if extra is None else (extra if isinstance(extra, tuple) else (extra,))
        out = _select(self.forward_func(*batch, *extra), _expand_target(target, n))
        if isinstance(out, torch.Tensor):
            if out.numel() != n:
                raise AssertionError("Number of outputs is not appropriate, must return one "
                                     "output per perturbed input")
            return out.flatten()
        return torch.tensor([out], device=torch.get_default_device())

    def attribute(self, inputs, target=None, additional_forward_args=None,
                  n_samples: int = 50, perturbations_per_eval: int = 1,
                  show_progress: bool = False, **kwargs):
        bar = tqdm(total=math.ceil(n_samples / perturbations_per_eval), file=sys.stderr,
                   desc=f"{getattr(self, '_name', None) or self.get_name()} attribution",
                   disable=not show_progress)
        with torch.no_grad(), bar:
            draw = self._sampler(inputs, kwargs)
            interps, sims, outputs, pending = [], [], [], []
            for _ in range(n_samples):
                try:
                    interp, model_input = draw()
                except StopIteration:
                    warnings.warn("Generator completed prior to given n_samples iterations!",
                                  stacklevel=2)
                    break
                interps.append(interp)
                pending.append(model_input)
                sim = self.similarity_func(inputs, model_input, interp, **kwargs)
                sims.append(sim.flatten() if isinstance(sim, torch.Tensor)
                            else torch.tensor([sim], device=torch.get_default_device()))
                if len(pending) == perturbations_per_eval:
                    outputs.append(self._evaluate(pending, target, additional_forward_args))
                    pending = []
                    bar.update()
            if pending:
                outputs.append(self._evaluate(pending, target, additional_forward_args))
                bar.update()
        x = torch.cat(interps).float()
        y = torch.cat([o.cpu() for o in outputs]).float()
        w = torch.cat([s.cpu() for s in sims]).float()
        self.interpretable_model.fit(DataLoader(TensorDataset(x.cpu(), y, w),
                                                batch_size=len(interps)))
        return self.interpretable_model.representation()

    def attribute_future(self, *args, **kwargs):
        raise NotImplementedError("LimeBase does not support attribution of future samples.")


def _masks(parts: tuple, feature_mask) -> tuple[tuple, int]:
    """The feature masks (every scalar alone, numbered across the inputs, by default) and
    the number of interpretable features (the largest id + 1; ids shifted to start at 0)."""
    if feature_mask is None:
        masks, offset = [], 0
        for p in parts:
            n = math.prod(p.shape[1:])
            masks.append((offset + torch.arange(n, device=p.device)).reshape(
                (1,) + tuple(p.shape[1:])))
            offset += n
        return tuple(masks), offset
    masks = feature_mask if isinstance(feature_mask, tuple) else (feature_mask,)
    lowest = min(int(m.min()) for m in masks if m.numel())
    if lowest != 0:
        warnings.warn("Minimum element in feature mask is not 0, shifting indices to start "
                      "at 0.", stacklevel=3)
        masks = tuple(m - lowest for m in masks)
    return masks, max(int(m.max()) for m in masks if m.numel()) + 1


def _in_input_shape(parts, masks, coefs, leading_one: bool):
    coefs = coefs.reshape(-1)
    out = []
    for p, m in zip(parts, masks):
        shape = (1,) + tuple(p.shape[1:]) if leading_one else tuple(p.shape)
        a = coefs.to(p.device)[m.long().expand(shape)] if m.numel() else \
            torch.zeros(shape, device=p.device)
        out.append(a.to(coefs.dtype))
    return tuple(out)


def general_lime(lime: LimeBase, inputs, baselines=None, target=None,
                 additional_forward_args=None, feature_mask=None, n_samples: int = 25,
                 perturbations_per_eval: int = 1, return_input_shape: bool = True,
                 show_progress: bool = False, **kwargs):
    """Captum's ``Lime.attribute`` over :class:`LimeBase` (one fit per example when the
    model gives one value per example, one fit for a whole-batch output)."""
    is_tuple = isinstance(inputs, tuple)
    parts = inputs if is_tuple else (inputs,)
    if baselines is None:
        baselines = 0.0
    bases = baselines if isinstance(baselines, tuple) else (baselines,) * len(parts)
    bases = tuple(torch.as_tensor(b, dtype=p.dtype, device=p.device) if not
                  isinstance(b, torch.Tensor) else b for b, p in zip(bases, parts))
    masks, n_interp = _masks(parts, feature_mask)
    batch = parts[0].shape[0]

    def one(x_parts, t, extra, b_parts, m_parts, leading_one):
        coefs = LimeBase.attribute(
            lime, x_parts if is_tuple else x_parts[0], target=t,
            additional_forward_args=extra, n_samples=n_samples,
            perturbations_per_eval=perturbations_per_eval, show_progress=show_progress,
            baselines=b_parts if is_tuple else b_parts[0],
            feature_mask=m_parts if is_tuple else m_parts[0],
            num_interp_features=n_interp, **kwargs)
        if not return_input_shape:
            return coefs.reshape(1, -1)
        shaped = _in_input_shape(x_parts, m_parts, coefs, leading_one)
        return shaped if is_tuple else shaped[0]

    if batch > 1:
        extra = additional_forward_args
        extra_t = () if extra is None else (extra if isinstance(extra, tuple) else (extra,))
        with torch.no_grad():
            test = lime.forward_func(*parts, *extra_t)
        test = _select(test, target)
        if isinstance(test, torch.Tensor) and test.numel() > 1:
            if test.numel() != batch:
                raise AssertionError("Invalid number of outputs, forward function should "
                                     "return a scalar per example or a scalar per input "
                                     "batch.")
            rows = []
            for i in range(batch):
                def row(v, i=i):
                    return v[i:i + 1] if isinstance(v, torch.Tensor) and v.dim() and \
                        v.shape[0] == batch else v
                t = target[i] if isinstance(target, list) else row(target)
                e = None if extra is None else (tuple(row(a) for a in extra_t)
                                               if isinstance(extra, tuple) else row(extra))
                rows.append(one(tuple(p[i:i + 1] for p in parts), t, e,
                                tuple(row(b) for b in bases),
                                tuple(row(m) for m in masks), False))
            if isinstance(rows[0], tuple):
                return tuple(torch.cat(r) for r in zip(*rows))
            return torch.cat(rows)
        if perturbations_per_eval != 1:
            raise AssertionError("Perturbations per eval must be 1 when forward function "
                                 "returns single value per batch!")
        return one(parts, target, additional_forward_args, bases, masks, True)
    return one(parts, target, additional_forward_args, bases, masks, False)
