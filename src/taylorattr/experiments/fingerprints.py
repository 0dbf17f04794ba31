"""What a result was computed from, as named short hashes, so that no result computed from
something else is ever reused (issue 28).

A fingerprint is a flat dict ``{field: digest}``; two results may be exchanged only when
every field is equal, and :func:`changed` names the fields that differ. The fields of a
dataset job's unit (:mod:`.evaluation.job`):

* ``model``: :func:`model_digest`, the weights and buffers (names, shapes, dtypes, bytes),
  the architecture (``repr``; a ``torch.export`` program's generated code) and the source
  of every module class defined outside torch; a loader may add what the module cannot
  say itself (``model.source_digest``: the exported file's hash, the user callable's
  module file and arguments);
* ``inputs``: one :func:`item_digest` per item of the unit, the content of what the
  method reads (input tensor after every transform, target, box mask), so a changed
  image file, a changed size or normalisation, or changed labels all show;
* ``method``: the methods with their settings (:meth:`BoundMethod.tag`) and the metrics
  with their options;
* ``seed``; ``version``: :func:`library_version` (the release, a hash of the library's
  sources, torch's version); ``job``: the remaining settings (batch size, baseline, ...).

``digest(obj)`` hashes any JSON-able value (dict keys sorted).
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
from collections.abc import Mapping
from pathlib import Path

import torch

from .. import __version__
from .._io import fingerprint as tensors_digest

__all__ = ["changed", "digest", "file_digest", "item_digest", "library_version",
           "model_digest", "tensors_digest"]

_SHORT = 16


def digest(obj) -> str:
    """A short hash of a JSON-able value (keys sorted, tuples as lists)."""
    text = json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:_SHORT]


def file_digest(path) -> str:
    """A short hash of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:_SHORT]


@functools.lru_cache(maxsize=1)
def library_version() -> str:
    """``<release>+src<hash of the library's .py files>+torch<version>``: a result of
    another build of the library (or of torch) is not reused."""

    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    return f"{__version__}+src{h.hexdigest()[:10]}+torch{torch.__version__}"


def _class_source(cls: type) -> str:
    if cls.__module__.split(".")[0] == "torch":
        return f"{cls.__module__}.{cls.__qualname__}"  # torch's own: its version says it
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):  # defined interactively: its name is all there is
        return f"{cls.__module__}.{cls.__qualname__}"


def model_digest(model: torch.nn.Module) -> str:
    """The model's weights and code (see the module docstring)."""
    code = [repr(model), str(getattr(model, "source_digest", ""))]
    code += sorted({_class_source(type(m)) for m in model.modules()})
    code += [str(getattr(m, "code", "")) for m in model.modules()
             if isinstance(m, torch.fx.GraphModule)]
    state = sorted(model.state_dict(keep_vars=False).items())
    return digest([tensors_digest(state), hashlib.sha256("\0".join(code).encode()).hexdigest()])


def item_digest(x: torch.Tensor, target, mask=None) -> str:
    """A short hash of one dataset item as a method reads it."""
    parts = [("x", x), ("target", torch.tensor(int(target), device=x.device))]
    if mask is not None:
        parts.append(("mask", mask))
    return tensors_digest(parts)


def changed(old: Mapping, new: Mapping) -> list[str]:
    """The fields whose values differ (missing on one side counts), sorted."""
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
