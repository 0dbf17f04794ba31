"""Infidelity (Yeh et al., NeurIPS 2019) under perturbation sets: square removal and
Gaussian noise, one score per sample:

    infidelity = mean_k (beta * sum(a * I_k) - (f(x) - f(x - I_k)))^2,
    beta = E[pred * change] / E[pred^2]   (the optimal scale; 1 without ``normalize``)

Sign convention as in ``docs/design.md``: attributions explain the output drop.

Why one module: both perturbation sets share the chunked removal pass, the optimal-beta
score and the argument checks; only how a perturbation is drawn differs.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from tqdm.auto import tqdm

from .._validation import (
    broadcast_baselines,
    check_bool,
    check_inputs,
    check_model,
    check_positive_int,
    check_real,
    check_seed,
    cpu_generator,
    draw,
    model_output,
    read_output,
    run_model,
    select_output,
)
from ..inputs import Layout, as_tuple, check_additional_args, check_batch
from ..runtime.batching import chunk_rows
from ..runtime.cost import Cost
from .fidelity import _acc_dtype

__all__ = ["gaussian_perturbation", "infidelity", "infidelity_cost", "optimal_beta_score",
           "square_removal", "square_removed_rows", "square_sums"]

Perturbation = Callable[[torch.Tensor, torch.Generator], "tuple[torch.Tensor, torch.Tensor]"]


# --------------------------------------------------------------------------------------
# perturbation sets
# --------------------------------------------------------------------------------------


def square_removal(height: int, width: int, max_side: int = 10, scale: int = 1) -> torch.Tensor:
    """Every square of side ``1..max_side`` that fits in a ``height x width`` image.

    Yeh et al.'s reference order (``saliency_evaluation/infid_sen_utils.py``,
    ``get_imageset``): side outermost, then the top row, then the left column.
    ``scale`` (for large images, as the assessment scales its patches): sides
    ``scale * (1..max_side)`` at tops and lefts on a grid of step ``scale``, i.e. the
    squares of the image shrunk ``scale`` times; 1 is Yeh et al.'s set.

    Returns:
        ``[N, 3]`` long tensor of ``(side, top, left)``; square k covers rows
        ``top:top+side`` and columns ``left:left+side``. A side larger than the image has
        no position and contributes nothing, so (``scale`` 1)
        ``N = sum_{s=1..max_side} max(height-s+1, 0) * max(width-s+1, 0)``
        (5,605 for 28x28 with ``max_side=10``).
    """
    check_positive_int(height, "height")
    check_positive_int(width, "width")
    check_positive_int(max_side, "max_side")
    check_positive_int(scale, "scale")
    parts = []
    for s in range(scale, scale * max_side + 1, scale):
        nh, nw = (height - s) // scale + 1, (width - s) // scale + 1
        if height < s or width < s:
            break
        top = torch.arange(nh, device="cpu").repeat_interleave(nw) * scale
        left = torch.arange(nw, device="cpu").repeat(nh) * scale
        parts.append(torch.stack([torch.full_like(top, s), top, left], dim=1))
    if not parts:
        return torch.zeros(0, 3, dtype=torch.long, device="cpu")
    return torch.cat(parts, dim=0)


def gaussian_perturbation(noise_std: float = 0.2) -> Perturbation:
    """A perturbation callable drawing ``I ~ N(0, noise_std^2)`` per feature.

    The returned callable follows the contract of ``infidelity(perturbation=...)``: called
    as ``perturb(inputs, generator)`` it returns ``(I, inputs - I)``. One draw of ``I``
    (shape ``inputs.shape[1:]``) is shared by every sample of the batch (common random
    numbers), so a sample's score never depends on the batch it is in. The draw is made
    in float64 on the CPU ``generator`` and then cast to the inputs' dtype and device, so
    a seed gives the same perturbations on every device and in float32 and float64.
    """
    check_real(noise_std, "noise_std", 0.0, strict=True)
    std = float(noise_std)

    def perturb(inputs: torch.Tensor, generator: torch.Generator):
        noise = draw(torch.randn, inputs.shape[1:], generator=generator, device=inputs.device,
                     dtype=torch.float64) * std
        i = noise.to(device=inputs.device, dtype=inputs.dtype).expand_as(inputs)
        return i, inputs - i

    perturb.noise_std = std
    return perturb


# --------------------------------------------------------------------------------------
# infidelity
# --------------------------------------------------------------------------------------


def _forward_rows(model, rows, target, batch_size, extra=()):
    """Explained output of ``model`` on ``rows`` ([R, ...]) in pieces of ``batch_size``;
    tensors in ``extra`` hold one row per row of ``rows`` and are cut alongside."""
    outs = []
    for start in range(0, rows.shape[0], batch_size):
        piece = rows[start:start + batch_size]
        if extra:
            ex = tuple(a[start:start + batch_size] if isinstance(a, torch.Tensor) else a
                       for a in extra)
            out = model_output(lambda r, ex=ex: model(r, *ex), piece)
        else:
            out = model_output(model, piece)
        t = None if target is None else target[start:start + batch_size]
        outs.append(select_output(out, t))
    return torch.cat(outs)


def square_sums(attributions: torch.Tensor, squares: torch.Tensor, acc=torch.float64):
    """The channel-summed attribution over each square (``[N, 3]`` rows ``side, top, left``
    of :func:`square_removal`): ``[B, N]``, from one integral image."""
    b, _, h, w = attributions.shape
    side, top, left = squares.to(attributions.device).unbind(1)
    # integral image: S[:, r, c] = sum of a[:, :r, :c]
    integral = torch.zeros(b, h + 1, w + 1, dtype=acc, device=attributions.device)
    integral[:, 1:, 1:] = attributions.to(acc).sum(1).cumsum(1).cumsum(2)
    bottom, right = top + side, left + side
    return (integral[:, bottom, right] - integral[:, top, right]
            - integral[:, bottom, left] + integral[:, top, left])


def square_removed_rows(inputs: torch.Tensor, baselines: torch.Tensor, squares: torch.Tensor,
                        per_forward: int):
    """Yield ``[B, m, C, H, W]`` copies of ``inputs`` with each of the next ``m`` squares
    set to ``baselines`` (shaped like ``inputs``), ``per_forward`` squares at a time.

    The copies are written into one buffer that every full chunk reuses (no fresh
    allocation, so no page faults, per chunk): each yielded tensor is overwritten by the
    next one; clone it to keep it.
    """
    b, _, h, w = inputs.shape
    side, top, left = squares.to(inputs.device).unbind(1)
    rows_idx = torch.arange(h, device=inputs.device)
    cols_idx = torch.arange(w, device=inputs.device)
    buffer = None
    for k0 in range(0, squares.shape[0], per_forward):
        t, l_, s = top[k0:k0 + per_forward], left[k0:k0 + per_forward], side[k0:k0 + per_forward]
        in_rows = (rows_idx >= t[:, None]) & (rows_idx < (t + s)[:, None])      # [m, H]
        in_cols = (cols_idx >= l_[:, None]) & (cols_idx < (l_ + s)[:, None])    # [m, W]
        mask = (in_rows[:, :, None] & in_cols[:, None, :])[None, :, None]      # [1,m,1,H,W]
        shape = (b, t.shape[0]) + tuple(inputs.shape[1:])
        if buffer is None or buffer.shape != shape:
            buffer = torch.empty(shape, dtype=inputs.dtype, device=inputs.device)
        yield torch.where(mask, baselines[:, None], inputs[:, None], out=buffer)  # [B,m,C,H,W]


def optimal_beta_score(pred: torch.Tensor, true: torch.Tensor, normalize: bool = True):
    """``mean_k (beta pred_k - true_k)^2`` per sample, ``beta = sum pred true / sum pred^2``
    (0 when every ``pred`` is 0) with ``normalize``, else ``beta = 1``."""
    if normalize:
        a2 = pred.pow(2).sum(1)
        beta = torch.where(a2 > 0, (pred * true).sum(1) / torch.where(a2 > 0, a2, 1.0), 0.0)
    else:
        beta = torch.ones(pred.shape[0], dtype=pred.dtype, device=pred.device)
    return (beta[:, None] * pred - true).pow(2).mean(1)


def _square_source(inputs, attributions, baselines, max_side, per_forward, acc, scale=1):
    """Predicted changes for every square (integral image) and a chunked perturbed-row maker."""
    _, _, h, w = inputs.shape
    squares = square_removal(h, w, max_side, scale)
    base = broadcast_baselines(0.0 if baselines is None else baselines, inputs)
    n_chunks = -(-squares.shape[0] // per_forward)
    return (square_sums(attributions, squares, acc),
            square_removed_rows(inputs, base, squares, per_forward), n_chunks)


def _draw_source(perturb, inputs, attributions, n, per_forward, seed, acc, preds):
    """Calls ``perturb`` once per draw; appends predicted changes to ``preds`` as it goes."""
    generator = cpu_generator(seed)
    attr = attributions.to(acc).flatten(1)

    def one_draw():
        res = perturb(inputs, generator)
        if not (isinstance(res, tuple) and len(res) == 2
                and all(isinstance(r, torch.Tensor) for r in res)):
            raise TypeError(
                "perturbation must return a tuple (I, perturbed_inputs) of two tensors, got "
                f"{type(res).__name__}"
            )
        pert, perturbed = res
        if perturbed.shape != inputs.shape:
            raise ValueError(
                f"perturbation returned perturbed inputs of shape {tuple(perturbed.shape)}; "
                f"expected the inputs' shape {tuple(inputs.shape)}"
            )
        try:
            pert = torch.broadcast_to(pert, inputs.shape)
        except RuntimeError:
            raise ValueError(
                f"perturbation returned I of shape {tuple(pert.shape)}, which does not "
                f"broadcast to the inputs' shape {tuple(inputs.shape)}"
            ) from None
        if not (torch.isfinite(pert).all() and torch.isfinite(perturbed).all()):
            raise ValueError("perturbation returned NaN or inf")
        preds.append((attr * pert.to(device=attr.device, dtype=acc).flatten(1)).sum(1))
        return perturbed.to(device=inputs.device, dtype=inputs.dtype)

    def chunks():
        for k0 in range(0, n, per_forward):
            m = min(per_forward, n - k0)
            yield torch.stack([one_draw() for _ in range(m)], dim=1)               # [B,m,...]

    return chunks(), -(-n // per_forward)


def infidelity(
    model,
    inputs: torch.Tensor,
    attributions: torch.Tensor,
    target=None,
    perturbation: str | Perturbation = "square",
    baselines=None,
    normalize: bool = True,
    max_side: int = 10,
    n_perturb_samples: int | None = None,
    noise_std: float | None = None,
    seed: int = 0,
    batch_size: int | None = None,
    show_progress: bool = False,
    additional_forward_args=None,
    scale: int = 1,
) -> torch.Tensor:
    r"""Infidelity of attributions (Yeh et al., NeurIPS 2019), one score per sample.

    For perturbations ``I_k`` that turn ``x`` into ``x_k`` (k = 1..N):

    .. math::

        \mathrm{pred}_k = \textstyle\sum_j a_j I_{k,j}, \qquad
        \mathrm{true}_k = f(x) - f(x_k), \qquad
        \mathrm{INFD} = \frac{1}{N}\sum_k (\beta\,\mathrm{pred}_k - \mathrm{true}_k)^2

    with ``beta = sum_k pred_k true_k / sum_k pred_k^2`` when ``normalize`` (the optimal
    scaling of the reference code, Captum's ``normalize=True``; ``beta = 0`` when every
    ``pred_k`` is 0, as Captum's ``safe_div`` gives) and ``beta = 1`` otherwise. ``f`` is
    the target logit (the model's output column, never a softmax unless the model has one).

    Perturbations (``perturbation``):

    * ``"square"`` (default; Yeh et al.'s "Square"): every square of side ``1..max_side``
      at every position (:func:`square_removal`; 5,605 squares on 28x28), all channels of
      its pixels set to ``baselines``. ``I`` is the square's indicator, so ``pred`` is the
      sum of the attribution (all channels) over the square; it is computed for all
      squares at once from an integral image. Inputs must be ``[B, C, H, W]``. For a
      linear model, Gradient*Input relative to the same baseline scores exactly 0.
    * ``"gaussian"``: ``n_perturb_samples`` draws (default 1000) of
      ``I ~ N(0, noise_std^2)`` per feature (default ``noise_std=0.2``, the reference
      code's scale) and ``x_k = x - I``; see :func:`gaussian_perturbation`. Draws are
      shared by every sample of the batch and come from a CPU ``torch.Generator`` seeded
      with ``seed``.
    * a callable ``perturbation(inputs, generator) -> (I, perturbed)``, called
      ``n_perturb_samples`` times (default 1000), each call one draw for the whole batch:
      ``inputs`` is the ``[B, ...]`` batch, ``generator`` a CPU ``torch.Generator`` seeded
      with ``seed`` (draw from it for reproducibility), ``I`` broadcasts to ``inputs``'
      shape and ``perturbed`` has it. ``perturbed`` need not equal ``inputs - I``
      (square removal is ``I`` = indicator, ``perturbed`` = inputs with the square
      replaced), exactly as Captum's ``perturb_func``.

    Args:
        model: callable mapping ``[R, ...]`` to ``[R]`` or ``[R, classes]``; run without
            gradients. It must treat the rows of a batch independently.
        inputs: ``[B, ...]`` float tensor (``[B, C, H, W]`` for ``"square"``).
        attributions: tensor of the shape of ``inputs`` (cast to its dtype).
        target: None (argmax of ``model(inputs)``), an int, or a ``[B]`` integer tensor.
        perturbation: ``"square"``, ``"gaussian"`` or a callable as above.
        baselines: the removal value for ``"square"``: None (= 0), a scalar, or a tensor
            broadcastable to ``inputs``. Only for ``"square"``.
        normalize: use the optimal ``beta`` (True) or ``beta = 1`` (False).
        max_side: largest square side for ``"square"``; sides that do not fit the image
            have no squares.
        scale: ``"square"`` on large images: squares of side ``scale * (1..max_side)`` on
            a grid of step ``scale`` (:func:`square_removal`); 1 is Yeh et al.'s set.
        n_perturb_samples: number of draws for ``"gaussian"`` or a callable; not for
            ``"square"``, whose set is fixed.
        noise_std: standard deviation for ``"gaussian"`` only.
        seed: seed of the generator for ``"gaussian"`` and callables.
        batch_size: the most perturbed copies given to ``model`` in one forward pass;
            default (None) sized from the model's measured memory per row against the
            memory budget (:func:`taylorattr.runtime.batching.chunk_rows`).
        show_progress: show a tqdm progress bar over forward passes.
        additional_forward_args: passed after the inputs to every model call (tensors in it
            batch-first, repeated with each sample's perturbed copies).

    Tuple inputs ``(x_1, ..., x_m)`` (with attributions of the same structure) are scored as
    one input, the concatenation of all features: ``pred_k = sum_i sum_j a_ij I_kij``
    (:mod:`taylorattr.inputs`). They take ``"gaussian"`` or a callable, which then receives
    and returns tuples (``I`` and ``perturbed`` one tensor per input), as Captum's.

    Returns:
        ``[B]`` tensor of infidelity scores, dtype of ``inputs`` (accumulated in float64).

    Raises:
        TypeError, ValueError: naming the offending argument.
    """
    check_model(model)
    if additional_forward_args is not None or not isinstance(inputs, torch.Tensor) or \
            inputs.dim() == 1:
        model, inputs, attributions, perturbation, extra = _one_tensor(
            model, inputs, attributions, perturbation, additional_forward_args)
    else:
        extra = ()
    inputs = check_inputs(inputs)
    if not isinstance(attributions, torch.Tensor):
        raise TypeError(f"attributions must be a torch.Tensor, got {type(attributions).__name__}")
    if attributions.shape != inputs.shape:
        raise ValueError(
            f"attributions must have the shape of inputs {tuple(inputs.shape)}, got "
            f"{tuple(attributions.shape)}"
        )
    attributions = check_inputs(attributions, "attributions").detach().to(inputs)
    inputs = inputs.detach()
    check_bool(normalize, "normalize")
    check_seed(seed)
    check_bool(show_progress, "show_progress")
    if batch_size is not None:
        check_positive_int(batch_size, "batch_size")
    check_positive_int(max_side, "max_side")
    check_positive_int(scale, "scale")

    if isinstance(perturbation, str):
        if perturbation not in ("square", "gaussian"):
            raise ValueError(
                f"perturbation must be 'square', 'gaussian' or a callable, got {perturbation!r}"
            )
    elif not callable(perturbation):
        raise TypeError(
            "perturbation must be 'square', 'gaussian' or a callable "
            f"(inputs, generator) -> (I, perturbed), got {type(perturbation).__name__}"
        )
    is_square = perturbation == "square"
    if is_square:
        if inputs.dim() != 4:
            raise ValueError(
                "perturbation='square' needs image inputs of shape [B, C, H, W] (C may be 1), "
                f"got inputs of shape {tuple(inputs.shape)}"
            )
        for name, val in (("n_perturb_samples", n_perturb_samples), ("noise_std", noise_std)):
            if val is not None:
                raise ValueError(
                    f"{name} does not apply to perturbation='square' (its set of squares is "
                    "fixed by the image size and max_side); leave it None"
                )
    else:
        if baselines is not None:
            raise ValueError("baselines only apply to perturbation='square'; leave it None")
        if scale != 1:
            raise ValueError("scale only applies to perturbation='square'; leave it 1")
        if callable(perturbation) and noise_std is not None:
            raise ValueError("noise_std only applies to perturbation='gaussian'")
        n_perturb_samples = 1000 if n_perturb_samples is None else n_perturb_samples
        check_positive_int(n_perturb_samples, "n_perturb_samples")

    b = inputs.shape[0]
    acc = _acc_dtype(inputs.device)
    with torch.no_grad():
        # the one forward, read by the methods' conventions (beyond [B, C]: flattened)
        _, flat, tgt, f0 = read_output(run_model(lambda rows: model(rows, *extra), inputs),
                                       target, inputs)
        if flat:
            model = _flattened(model)
        if batch_size is None:  # measured on the model alone; with extra arguments a fixed size
            batch_size = int(chunk_rows(model, inputs, backward=False)) if not extra else 1024
        per_forward = max(1, batch_size // b)  # perturbations per forward pass (all samples)

        preds: list[torch.Tensor] = []
        if is_square:
            pred, chunks, n_chunks = _square_source(
                inputs, attributions, baselines, max_side, per_forward, acc, scale)
        else:
            perturb = (gaussian_perturbation(0.2 if noise_std is None else noise_std)
                       if perturbation == "gaussian" else perturbation)
            chunks, n_chunks = _draw_source(
                perturb, inputs, attributions, n_perturb_samples, per_forward, seed, acc, preds)

        trues = []
        for chunk in tqdm(chunks, total=n_chunks, disable=not show_progress,
                          desc="infidelity", leave=False):
            m = chunk.shape[1]
            rows = chunk.reshape(b * m, *inputs.shape[1:])
            t = None if tgt is None else tgt.repeat_interleave(m)
            ex = tuple(a.repeat_interleave(m, 0) if isinstance(a, torch.Tensor) else a
                       for a in extra)  # rows are (sample, perturbation), sample-major
            f = _forward_rows(model, rows, t, batch_size, ex).view(b, m)
            trues.append((f0[:, None] - f).to(acc))
        true = torch.cat(trues, dim=1)
        if not is_square:
            pred = torch.stack(preds, dim=1)

    return optimal_beta_score(pred, true, normalize).to(inputs.dtype)


def _flattened(model):
    """``model`` with its output beyond ``[B, C]`` seen flattened to ``[B, -1]``, as
    :func:`~taylorattr._validation.read_output` reads it."""

    def flat(rows, *ex):
        return model(rows, *ex).flatten(1)

    return flat


def _one_tensor(model, inputs, attributions, perturbation, additional_forward_args):
    """Tuple inputs and batch-first additional arguments as one tensor: ``(model(rows,
    *extra), joined inputs, joined attributions, perturbation on joined rows, extra)``."""
    parts, is_tuple = as_tuple(inputs)
    batch = check_batch(parts, vectors=True)
    extra = check_additional_args(additional_forward_args, batch)
    layout = Layout.of(parts, is_tuple)
    attr_parts, attr_tuple = as_tuple(attributions, "attributions")
    if attr_tuple != is_tuple or len(attr_parts) != len(parts):
        raise ValueError(f"attributions must have the structure of inputs ({len(parts)} "
                         f"tensor{'s' if len(parts) > 1 else ''}"
                         f"{' in a tuple' if is_tuple else ''}), got {len(attr_parts)}")
    for i, (a, p) in enumerate(zip(attr_parts, parts)):
        if a.shape != p.shape:
            raise ValueError(f"attributions[{i}] must have the shape of inputs[{i}] "
                             f"{tuple(p.shape)}, got {tuple(a.shape)}")
    if layout.flat and perturbation == "square":
        raise ValueError("perturbation='square' needs one image tensor [B, C, H, W]; for "
                         "tuple inputs use 'gaussian' or a callable")
    if layout.flat and callable(perturbation):
        user = perturbation

        def perturbation(flat, generator):
            res = user(layout.result(layout.split(flat)), generator)
            if is_tuple and not (isinstance(res, tuple) and len(res) == 2 and all(
                    isinstance(r, (tuple, list)) and len(r) == len(parts) for r in res)):
                raise TypeError(f"perturbation must return (I, perturbed) with one tensor "
                                f"per input ({len(parts)}) in each, for tuple inputs")
            if not (isinstance(res, tuple) and len(res) == 2):
                raise TypeError("perturbation must return a pair (I, perturbed)")
            pert, moved = (res if is_tuple else ((res[0],), (res[1],)))
            pert = tuple(torch.broadcast_to(torch.as_tensor(q, dtype=flat.dtype, device=flat.device),
                                            (flat.shape[0],) + s)
                         for q, s in zip(pert, layout.shapes))
            return layout.join(pert), layout.join(tuple(moved))

    def wrapped(rows, *ex):
        return model(*layout.split(rows), *ex)

    return (wrapped, layout.join(parts), layout.join(tuple(a.detach() for a in attr_parts)),
            perturbation, extra)


def infidelity_cost(inputs: torch.Tensor, perturbation="square", max_side: int = 10,
                    n_perturb_samples: int | None = None, scale: int = 1):
    """The rows :func:`infidelity` runs (a :class:`~taylorattr.runtime.cost.Cost`): one forward of
    the batch and one per (sample, perturbation): the squares of :func:`square_removal`
    (``"square"``) or ``n_perturb_samples`` draws (default 1000). Runs no model."""

    inputs = check_inputs(inputs)
    b = inputs.shape[0]
    if perturbation == "square":
        if inputs.dim() != 4:
            raise ValueError("perturbation='square' needs image inputs of shape [B, C, H, W], "
                             f"got inputs of shape {tuple(inputs.shape)}")
        n = square_removal(inputs.shape[2], inputs.shape[3], max_side, scale).shape[0]
    else:
        n = check_positive_int(1000 if n_perturb_samples is None else n_perturb_samples,
                               "n_perturb_samples")
    return Cost(label="infidelity", samples=b, forward_rows=b + b * n)
