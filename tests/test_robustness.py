"""Malformed input to every public entry point (issue 8).

Property tests (hypothesis, derandomized): each call gets one malformed argument (wrong
shape or rank, mismatched baselines, integer/half/bool/complex dtypes, NaN and inf, an
empty batch, a target out of range, a model whose output has the wrong rank, dtype or
batch size or is non-finite, a bad option value) and must raise ``ValueError`` or
``TypeError`` whose message names that argument. Any other exception fails the test.

Entry points: ``taylor_terms``, ``taylor_attribution``, ``group_expansions``, the seven
methods of ``METHODS``, ``reformulate`` for each method, the four metrics, ``audit`` and
the command line (``main(argv)``: a malformed command line exits with status 2 and a
message naming the option, and never runs a command).

Cases that once failed in other modules keep their own regression tests at the end of
the file.

Models are tiny float64 MLPs; every generated case takes milliseconds. The number of
generated cases is counted and checked (>= 1,000) by the last test of the module.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import io
import keyword
import math
from collections import Counter
from dataclasses import dataclass, field
from unittest import mock

import numpy as np
import pytest
import torch
from _builders import DT as D
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import taylorattr as ta
from taylorattr import cli
from taylorattr import metrics as M
from taylorattr.methods import UnsupportedModelError
from taylorattr.methods.integrated_gradients import QUADRATURE_METHODS
from taylorattr.models import Square
from taylorattr.principles import audit
from taylorattr.registry import METHODS
from taylorattr.taylor.mode import UnsupportedOperation
from taylorattr.taylor.terms import group_expansions, taylor_attribution

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")

N_CLASSES = 3
CASES: Counter = Counter()  # test name -> generated cases run (checked by the last test)


def budget(n: int):
    """Hypothesis settings: ``n`` cases, reproducible (derandomized, no example database)."""
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=False)


def property_test(n: int, bucket: str):
    """A hypothesis test over ``data`` with :func:`budget` ``n``, counting each generated
    case under ``CASES[bucket]``."""
    def decorate(fn):
        @functools.wraps(fn)
        def counted(*args, **kwargs):
            CASES[bucket] += 1
            return fn(*args, **kwargs)
        return budget(n)(given(data=st.data())(counted))
    return decorate


def expect_error(call, *names: str, model=None):
    """``call()`` must raise ValueError/TypeError whose message names one of ``names``.

    Any other exception propagates and fails the test. For a malformed model, the
    layer-wise and Taylor-mode engines' own ``UnsupportedModelError`` /
    ``UnsupportedOperation`` (TypeErrors that name the offending operation) also count.
    """
    try:
        call()
    except (ValueError, TypeError) as exc:
        msg = str(exc)
        if isinstance(model, nn.Module) and (
                isinstance(exc, (UnsupportedModelError, UnsupportedOperation))
                or type(model).__name__ in msg):
            return exc
        assert any(n in msg for n in names), (
            f"{type(exc).__name__} does not name {' or '.join(map(repr, names))}: {msg}")
        return exc
    raise AssertionError(f"no error for a malformed {' / '.join(names)}")


# ------------------------------------------------------------------------------ models
@contextlib.contextmanager
def _seeded(seed: int):
    """Build parameters without touching the global RNG (other tests rely on its state)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@functools.cache
def mlp(n_features: int, n_out: int = N_CLASSES) -> nn.Module:
    """Flatten, Linear, Sigmoid, Linear: supported by every method and the Taylor engine."""
    with _seeded(n_features):
        return nn.Sequential(nn.Flatten(), nn.Linear(n_features, 3), nn.Sigmoid(),
                             nn.Linear(3, n_out)).to(D).eval()


class Scalar(nn.Module):
    """A model whose output is ``[B]`` (one explained value per sample)."""

    def __init__(self, n_features: int):
        super().__init__()
        self.core = mlp(n_features, 1)

    def forward(self, x):
        return self.core(x).squeeze(1)


class BadOutput(nn.Module):
    """The MLP with its output made malformed in one way (traceable by torch.fx)."""

    def __init__(self, n_features: int, kind: str):
        super().__init__()
        self.kind = kind
        self.core = copy.deepcopy(mlp(n_features))
        if kind in ("nan", "inf", "-inf"):
            with torch.no_grad():
                self.core[3].bias[1] = float(kind)
        self.eval()

    def forward(self, x):
        y = self.core(x)
        if self.kind == "rank3":  # [B, C, 2]: with singleton axes it would read as [B, C]
            return y.unsqueeze(-1).expand(-1, -1, 2)
        if self.kind == "rank0":
            return y.sum()
        if self.kind == "batch":
            return y.reshape(-1)
        if self.kind == "tuple":
            return (y,)
        if self.kind == "int":
            return y.long()
        if self.kind == "half":
            return y.half()
        return y


MODEL_KINDS = ("rank3", "rank0", "batch", "tuple", "int", "half", "nan", "inf", "-inf",
               "not_callable", "function")


def bad_model(kind: str, n_features: int):
    if kind == "not_callable":
        return "model"
    if kind == "function":  # a callable that is not an nn.Module, output of the wrong rank
        return lambda x: x.flatten(1).sum(1, keepdim=True).unsqueeze(-1).expand(-1, -1, 2)
    return BadOutput(n_features, kind)


# ------------------------------------------------------------------------------ inputs
@st.composite
def sample_shapes(draw):
    """``[B, n]`` vectors or ``[B, 1, h, w]`` images, all tiny."""
    batch = draw(st.integers(1, 3))
    if draw(st.booleans()):
        return (batch, draw(st.integers(2, 5)))
    return (batch, 1, draw(st.integers(2, 3)), draw(st.integers(2, 3)))


def n_features(shape) -> int:
    return math.prod(shape[1:])


def rand(shape, seed: int, dtype=D) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


BAD_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
              torch.complex64)  # float16 and bfloat16 run (issue 34)
NONFINITE = (float("nan"), float("inf"), float("-inf"))
INPUT_KINDS = ("not_tensor", "rank", "empty_batch", "no_features", "dtype", "nonfinite")


@st.composite
def malformed_tensor(draw, shape, kinds=INPUT_KINDS, dtypes=BAD_DTYPES):
    """A tensor argument that should have been a finite float ``shape`` batch."""
    kind = draw(st.sampled_from(kinds))
    good = rand(shape, draw(st.integers(0, 2**16)))
    if kind == "not_tensor":
        return draw(st.sampled_from([good.tolist(), good.cpu().numpy(), 0.5, None, "x", (1, 2)]))
    if kind == "rank":
        return draw(st.sampled_from([good.sum(), good.flatten()[: draw(st.integers(1, 4))]]))
    if kind == "empty_batch":
        return torch.zeros((0,) + tuple(shape[1:]), dtype=D)
    if kind == "no_features":
        return torch.zeros((shape[0], 0) + draw(st.sampled_from([(), (3,)])), dtype=D)
    if kind == "dtype":
        dtype = draw(st.sampled_from(dtypes))
        return (good * 3).to(dtype)
    if kind == "nonfinite":
        bad = good.clone()
        bad.view(-1)[draw(st.integers(0, bad.numel() - 1))] = draw(st.sampled_from(NONFINITE))
        return bad
    raise AssertionError(kind)


@st.composite
def malformed_baselines(draw, shape):
    """Baselines for a broadcast argument: scalar, ``[*feature]`` or ``[B, *feature]``."""
    kind = draw(st.sampled_from(("shape", "nonfinite_scalar", "nonfinite_tensor", "dtype",
                                 "type")))
    if kind == "shape":  # never broadcasts to ``shape``
        return draw(st.sampled_from([torch.zeros(shape[-1] + 1, dtype=D),
                                     torch.zeros((shape[0] + 2,) + tuple(shape[1:]), dtype=D),
                                     torch.zeros(tuple(shape) + (2,), dtype=D)]))
    if kind == "nonfinite_scalar":
        return draw(st.sampled_from(NONFINITE))
    if kind == "nonfinite_tensor":
        return draw(malformed_tensor(shape[1:] if draw(st.booleans()) else shape, ("nonfinite",)))
    if kind == "dtype":  # int32/int64 baselines are accepted (cast), the rest are not
        dtype = draw(st.sampled_from((torch.complex64, torch.bool, torch.int8, torch.uint8)))
        return torch.zeros(shape[1:], dtype=dtype)
    return draw(st.sampled_from(["zero", [0.0], None, True, 1j, {"b": 0}]))


@st.composite
def malformed_reference(draw, shape):
    """Expected Gradients' reference tensor ``[N, *feature]`` made malformed."""
    feat = tuple(shape[1:])
    kind = draw(st.sampled_from(("rank", "features", "empty", "nonfinite", "type")))
    if kind == "rank":
        return draw(st.sampled_from([torch.zeros(feat, dtype=D), torch.zeros((), dtype=D),
                                     torch.zeros((2, 2) + feat, dtype=D)]))
    if kind == "features":
        return torch.zeros((2,) + feat[:-1] + (feat[-1] + 1,), dtype=D)
    if kind == "empty":
        return torch.zeros((0,) + feat, dtype=D)
    if kind == "nonfinite":
        return draw(malformed_tensor((draw(st.integers(1, 3)),) + feat, ("nonfinite",)))
    return draw(st.sampled_from([0.0, 1, "ref", [0.0], True]))


@st.composite
def malformed_target(draw, batch, n_classes=N_CLASSES):
    kind = draw(st.sampled_from(("range", "np_range", "float", "bool", "str", "list",
                                 "tensor_dtype", "tensor_shape", "tensor_range")))
    if kind == "range":
        return draw(st.one_of(st.integers(max_value=-1), st.integers(min_value=n_classes),
                              st.sampled_from([-(10**20), 10**20, 2**63, -(2**63) - 1])))
    if kind == "np_range":
        return np.int64(draw(st.sampled_from([-1, n_classes, 2**40])))
    if kind == "float":
        return draw(st.floats(allow_nan=True, allow_infinity=True))
    if kind == "bool":
        return draw(st.booleans())
    if kind == "str":
        return draw(st.text(max_size=2))
    if kind == "list":  # a list of one class per sample is Captum's form: one too many here
        return [0] * (batch + 1)
    if kind == "tensor_dtype":
        dtype = draw(st.sampled_from((torch.float32, torch.float64, torch.bool, torch.complex64)))
        return torch.zeros(batch, dtype=dtype)
    if kind == "tensor_shape":
        return torch.zeros(draw(st.sampled_from([(batch + 1,), (batch, 1), (2, batch)])),
                           dtype=torch.long)
    t = torch.zeros(batch, dtype=torch.long)
    t[draw(st.integers(0, batch - 1))] = draw(st.sampled_from([-1, n_classes, 10**12]))
    return t


# Bad values for options
NOT_INT = st.one_of(st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=2), st.just([1]), st.just(2.0))
BAD_OPTIONAL_POSINT = st.one_of(st.integers(max_value=0), NOT_INT)  # None means "automatic"
BAD_POSINT = st.one_of(BAD_OPTIONAL_POSINT, st.none())
NOT_BOOL = st.one_of(st.integers(), st.text(max_size=2), st.none(), st.floats(), st.just([]))
BAD_POSITIVE_REAL = st.one_of(st.floats(max_value=0.0), st.sampled_from([math.nan, math.inf]),
                              st.text(max_size=2), st.booleans(), st.just([0.1]))
BAD_SEED = st.one_of(st.integers(max_value=-1), st.integers(min_value=2**63), NOT_INT, st.none())


def const(strategy):
    return lambda shape: strategy


def _bad_patch(shape):
    d = 2 if len(shape) == 4 else 1
    largest = max(shape[-d:])
    return st.one_of(st.integers(max_value=0), st.integers(largest + 1, largest + 5),
                     st.sampled_from([(1,) * len(shape), (), (0,) * d, 1.5, True, "2", None,
                                      [1.0]]))


def _bad_groups(shape):
    feat = tuple(shape[1:])
    n = math.prod(feat)
    ids = torch.arange(n).view(feat)
    return st.sampled_from([ids.double(), ids > 0, ids.flatten()[:-1] if n > 1 else ids.view(-1, 1),
                            ids - 1, ids.tolist(), torch.zeros(feat + (2,), dtype=torch.long),
                            ids.to(torch.complex64)])


# ------------------------------------------------------------------------------ entries
@dataclass(frozen=True)
class Entry:
    """A public entry point ``call(model, inputs, **kwargs)`` and what it accepts."""

    name: str
    call: object
    baselines: str | None = "broadcast"   # "broadcast", "reference" (EG) or None
    target: bool = True
    layerwise: bool = False
    options: dict = field(default_factory=dict)   # option -> (shape -> strategy of bad values)
    accepted: frozenset = frozenset()             # keyword names the call accepts


def _method_entry(name: str, **defaults) -> Entry:
    spec = METHODS[name]
    params = set(spec.signature().parameters) | set(spec.init_args) | {"model"}
    options = {"return_convergence_delta": const(NOT_BOOL)}
    if name.startswith("occlusion"):
        options.update(perturbations_per_eval=const(BAD_OPTIONAL_POSINT),
                       show_progress=const(NOT_BOOL))
        if name == "occlusion_patch":
            options["patch"] = _bad_patch
        else:
            options["patch"] = const(st.integers(2, 9))  # occlusion_1 pins patch=1
        options["stride"] = const(st.one_of(st.integers(max_value=0), st.integers(2, 5),
                                            st.sampled_from([1.5, True, "1", (1, 1, 1, 1, 1)])))
    if name == "integrated_gradients":
        options.update(n_steps=const(BAD_POSINT), internal_batch_size=const(BAD_OPTIONAL_POSINT),
                       method=const(st.one_of(st.text(max_size=4).filter(
                           lambda s: s not in QUADRATURE_METHODS), st.none(), st.integers())),
                       show_progress=const(NOT_BOOL))
    if name == "expected_gradients":
        options.update(n_samples=const(BAD_POSINT), noise_std=const(BAD_POSITIVE_REAL),
                       seed=const(BAD_SEED), internal_batch_size=const(BAD_OPTIONAL_POSINT),
                       draws=const(st.sampled_from([1, "draws", {"baselines": 0}])),
                       show_progress=const(NOT_BOOL))
    if name == "epsilon_lrp":
        options["epsilon"] = const(st.one_of(st.floats(max_value=-1e-300),
                                             st.sampled_from([math.nan, math.inf, None, "e",
                                                              True])))
    baselines = None if not spec.uses_baselines else (
        "reference" if name == "expected_gradients" else "broadcast")
    return Entry(f"method:{name}", lambda m, x, **kw: spec(m, x, **{**defaults, **kw}),
                 baselines=baselines, layerwise=name in ("deeplift", "epsilon_lrp"),
                 options=options, accepted=frozenset(params))


# The extra keyword arguments reformulate() documents for each method.
REFORMULATE_KWARGS = {
    "gradient_input": set(), "deeplift": set(), "integrated_gradients": set(),
    "occlusion_1": {"patch", "stride", "chunk_size", "show_progress"},
    "occlusion_patch": {"patch", "stride", "chunk_size", "show_progress"},
    "epsilon_lrp": {"epsilon"}, "expected_gradients": {"n_samples", "noise_std", "seed"},
}


def _reform_entry(name: str, **defaults) -> Entry:
    options = {"order": const(BAD_POSINT),
               "method": const(st.one_of(st.text(max_size=5).filter(lambda s: s not in METHODS),
                                         st.integers(), st.none()))}
    if name == "occlusion_patch":
        options["patch"] = _bad_patch
        options["stride"] = const(st.integers(3, 5))
    if name == "occlusion_1":
        options["patch"] = const(st.integers(2, 9))
    if name == "expected_gradients":
        options.update(n_samples=const(BAD_POSINT), noise_std=const(BAD_POSITIVE_REAL),
                       seed=const(BAD_SEED))
    if name == "epsilon_lrp":
        options["epsilon"] = const(st.sampled_from([-1.0, math.nan, math.inf, None, "e"]))
    baselines = {"none": None, "distribution": "reference"}.get(METHODS[name].baseline_kind,
                                                                "broadcast")

    def call(m, x, method=name, **kw):
        return ta.reformulate(method, m, x, **{**defaults, **kw})

    accepted = REFORMULATE_KWARGS.get(name, set(METHODS[name].reformulation.options)) | {"method", "model", "inputs", "baselines", "target",
                                           "order"}
    return Entry(f"reformulate:{name}", call, baselines=baselines,
                 layerwise=name in ("deeplift", "epsilon_lrp"), options=options,
                 accepted=frozenset(accepted))


_DEFAULT = object()


def _infidelity(m, x, **kw):
    attributions = kw.pop("attributions", _DEFAULT)
    if attributions is _DEFAULT:
        attributions = torch.ones_like(x) if isinstance(x, torch.Tensor) else torch.ones(1, 2)
    kw.setdefault("perturbation", "gaussian")
    if kw["perturbation"] == "gaussian":
        kw.setdefault("n_perturb_samples", 3)
    return M.infidelity(m, x, attributions, **kw)


def _cheap_attribution(model, x, baselines, target):
    return x - baselines


ENTRIES: dict[str, Entry] = {e.name: e for e in [
    Entry("taylor_terms", lambda m, x, **kw: ta.taylor_terms(m, x, **kw),
          options={"order": const(BAD_POSINT), "chunk_size": const(BAD_OPTIONAL_POSINT),
                   "show_progress": const(NOT_BOOL)},
          accepted=frozenset({"model", "inputs", "baselines", "target", "order", "chunk_size",
                              "show_progress"})),
    Entry("taylor_attribution", lambda m, x, **kw: taylor_attribution(m, x, **kw),
          options={"order": const(BAD_POSINT)},
          accepted=frozenset({"model", "inputs", "baselines", "target", "order"})),
    Entry("group_expansions", lambda m, x, **kw: group_expansions(m, x, **kw),
          options={"order": const(BAD_POSINT), "chunk_size": const(BAD_OPTIONAL_POSINT),
                   "groups": _bad_groups, "show_progress": const(NOT_BOOL)},
          accepted=frozenset({"model", "inputs", "baselines", "target", "order", "groups",
                              "chunk_size", "show_progress"})),
    _method_entry("gradient_input"),
    _method_entry("occlusion_1"),
    _method_entry("occlusion_patch"),
    _method_entry("deeplift"),
    _method_entry("epsilon_lrp"),
    _method_entry("integrated_gradients", n_steps=3),
    _method_entry("expected_gradients", noise_std=0.1, n_samples=2),
    *[_reform_entry(n) for n, spec in METHODS.items()
      if spec.reformulation is not None and n not in ("expected_gradients", "gradient_shap")],
    _reform_entry("gradient_shap", noise_std=0.1, n_samples=2),
    _reform_entry("expected_gradients", noise_std=0.1, n_samples=2),
    Entry("metrics.infidelity", _infidelity, baselines=None,
          options={"attributions": lambda shape: malformed_tensor(
                       shape, ("not_tensor", "dtype", "nonfinite", "empty_batch")),
                   "perturbation": const(st.one_of(
                       st.text(max_size=6).filter(lambda s: s not in ("square", "gaussian")),
                       st.sampled_from([None, 3, ["gaussian"]]))),
                   "n_perturb_samples": const(BAD_OPTIONAL_POSINT),
                   "noise_std": const(BAD_POSITIVE_REAL),
                   "seed": const(st.one_of(st.floats(), st.text(max_size=2), st.booleans(),
                                           st.none())),
                   "batch_size": const(BAD_POSINT), "max_side": const(BAD_POSINT),
                   "normalize": const(NOT_BOOL),
                   "baselines": const(st.sampled_from([0.0, torch.zeros(1)]))},
          accepted=frozenset({"model", "inputs", "attributions", "target", "perturbation",
                              "baselines", "normalize", "max_side", "n_perturb_samples",
                              "noise_std", "seed", "batch_size", "show_progress"})),
    Entry("audit(models=...)", lambda m, x, **kw: audit(
        _cheap_attribution, models=[(m, x)], **kw), baselines=None, target=False),
]}
MODEL_ENTRIES = sorted(ENTRIES)
BASELINE_ENTRIES = sorted(n for n, e in ENTRIES.items() if e.baselines)
TARGET_ENTRIES = sorted(n for n, e in ENTRIES.items() if e.target)
OPTION_ENTRIES = sorted(n for n, e in ENTRIES.items() if e.options)
KWARG_ENTRIES = sorted(n for n, e in ENTRIES.items() if e.accepted)


def _valid_call(entry: Entry, shape, /, **kw):
    return entry.call(mlp(n_features(shape)), rand(shape, 0), **kw)


@pytest.mark.parametrize("name", MODEL_ENTRIES)
def test_every_entry_runs_on_the_valid_arguments_the_properties_start_from(name):
    """The unmodified calls succeed, so every error below comes from the one bad argument."""
    entry = ENTRIES[name]
    for shape in [(2, 4), (1, 1, 2, 3)]:
        _valid_call(entry, shape)
        if entry.target:
            _valid_call(entry, shape, target=N_CLASSES - 1)
            _valid_call(entry, shape, target=torch.tensor([0] * shape[0]))
        if entry.baselines == "broadcast":
            _valid_call(entry, shape, baselines=rand(shape[1:], 5))
        if entry.baselines == "reference":
            _valid_call(entry, shape, baselines=rand((3,) + shape[1:], 5), noise_std=None)
    if name == "metrics.infidelity":
        _valid_call(entry, (2, 1, 2, 3), perturbation="square")


# ------------------------------------------------------------------------------ properties
@pytest.mark.parametrize("name", MODEL_ENTRIES)
@property_test(16, "inputs")
def test_malformed_inputs_are_refused_naming_inputs(name, data):
    entry = ENTRIES[name]
    shape = data.draw(sample_shapes())
    kinds = INPUT_KINDS + (() if entry.layerwise else ("features",))
    kind = data.draw(st.sampled_from(kinds))
    if kind == "features":  # a finite float batch of a shape the model does not take
        bad = rand(shape[:-1] + (shape[-1] + 1,), 1)
    else:
        bad = data.draw(malformed_tensor(shape, (kind,)))
    expect_error(lambda: entry.call(mlp(n_features(shape)), bad), "inputs")


@pytest.mark.parametrize("name", BASELINE_ENTRIES)
@property_test(12, "baselines")
def test_malformed_baselines_are_refused_naming_baselines(name, data):
    entry = ENTRIES[name]
    shape = data.draw(sample_shapes())
    if entry.baselines == "reference":
        bad = data.draw(malformed_reference(shape))
        extra = {"noise_std": None}
    else:
        bad = data.draw(malformed_baselines(shape))
        extra = {}
    expect_error(lambda: _valid_call(entry, shape, baselines=bad, **extra), "baselines")


def test_infidelity_square_removal_refuses_malformed_baselines():
    shape = (2, 1, 3, 3)
    for bad in [math.nan, torch.zeros(4), torch.zeros(3, dtype=torch.complex64), "0"]:
        CASES["baselines"] += 1
        expect_error(lambda b=bad: _infidelity(mlp(9), rand(shape, 0), perturbation="square",
                                               baselines=b), "baselines")


@pytest.mark.parametrize("name", TARGET_ENTRIES)
@property_test(12, "target")
def test_malformed_targets_are_refused_naming_target(name, data):
    entry = ENTRIES[name]
    shape = data.draw(sample_shapes())
    if data.draw(st.integers(0, 5)) == 0:  # a [B] output takes no target at all
        model, bad = Scalar(n_features(shape)), data.draw(st.one_of(
            st.integers(0, 3), st.just(torch.zeros(shape[0], dtype=torch.long))))
    else:
        model, bad = mlp(n_features(shape)), data.draw(malformed_target(shape[0]))
    expect_error(lambda: entry.call(model, rand(shape, 0), target=bad), "target")


@pytest.mark.parametrize("name", [n for n in MODEL_ENTRIES if not n.startswith("audit")])
@property_test(10, "model")
def test_malformed_models_are_refused_naming_model(name, data):
    entry = ENTRIES[name]
    shape = data.draw(sample_shapes())
    kinds = MODEL_KINDS
    if name.startswith("method:") and METHODS[name[len("method:"):]].cls.perturbation:
        # one value (or a few) for the whole batch: Captum's aggregate mode
        # of the perturbation methods (tests/test_captum_compat.py), not malformed for them
        kinds = tuple(k for k in MODEL_KINDS if k not in ("rank0", "batch"))
    model = bad_model(data.draw(st.sampled_from(kinds)), n_features(shape))
    expect_error(lambda: entry.call(model, rand(shape, 0)), "model", model=model)


@pytest.mark.parametrize("kind", ["rank3", "batch", "int", "nan", "not_callable", "function"])
def test_audit_refuses_extra_models_with_malformed_output(kind):
    """Few cases: every audit runs the probe suite (~0.5 s) before the extra models."""
    CASES["model"] += 1
    model = bad_model(kind, 4)
    expect_error(lambda: audit(_cheap_attribution, models=[(model, rand((2, 4), 0))]),
                 "model", model=model)


@pytest.mark.parametrize("name", OPTION_ENTRIES)
@property_test(16, "options")
def test_malformed_options_are_refused_naming_the_option(name, data):
    entry = ENTRIES[name]
    shape = data.draw(sample_shapes())
    option = data.draw(st.sampled_from(sorted(entry.options)))
    value = data.draw(entry.options[option](shape))
    kw = {option: value}
    if option == "stride" and name.startswith("method:occlusion"):
        kw.setdefault("patch", 1)
    if name == "metrics.infidelity" and option in ("max_side",):
        shape, kw["perturbation"] = (shape[0], 1, 2, 3), "square"
    if name == "metrics.infidelity" and option == "baselines":
        kw["perturbation"] = "gaussian"  # baselines only apply to square removal
    expect_error(lambda: _valid_call(entry, shape, **kw), option)


@pytest.mark.parametrize("name", KWARG_ENTRIES)
@property_test(4, "kwargs")
def test_unknown_keyword_arguments_are_refused_naming_them(name, data):
    entry = ENTRIES[name]
    word = data.draw(st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True).filter(
        lambda s: s not in entry.accepted and not keyword.iskeyword(s)))
    expect_error(lambda: _valid_call(entry, (2, 4), **{word: 1}), word)


# ------------------------------------------------------------------------------ metrics
@property_test(60, "metrics")
def test_percentage_change_refuses_malformed_attributions(data):
    shape = data.draw(sample_shapes())
    good = rand(shape, 0)
    which = data.draw(st.sampled_from(["original", "reformulated", "shape"]))
    if which == "shape":
        other = rand(data.draw(sample_shapes()).__add__((2,)), 1)
        expect_error(lambda: M.percentage_change(good, other), "original", "reformulated")
        return
    bad = data.draw(malformed_tensor(shape))
    args = (bad, good) if which == "original" else (good, bad)
    expect_error(lambda: M.percentage_change(*args), which)


@property_test(60, "metrics")
def test_approximation_error_refuses_malformed_per_sample_values(data):
    batch = data.draw(st.integers(1, 4))
    good = rand((batch,), 0) + 0.1
    which = data.draw(st.sampled_from(["error", "output_change", "length"]))
    if which == "length":
        expect_error(lambda: M.approximation_error(good, rand((batch + 1,), 1)), "error")
        return
    kind = data.draw(st.sampled_from(["not_tensor", "rank", "empty", "dtype", "nonfinite"]))
    if kind == "rank":
        bad = data.draw(st.sampled_from([good.sum(), good.view(batch, 1), rand((batch, 2), 2)]))
    elif kind == "empty":
        bad = torch.zeros(0, dtype=D)
    else:
        bad = data.draw(malformed_tensor((batch,), (kind,)))
    args = (bad, good) if which == "error" else (good, bad)
    expect_error(lambda: M.approximation_error(*args), which)


@property_test(70, "metrics")
def test_bbox_accuracy_refuses_malformed_attributions_masks_and_options(data):
    b = data.draw(st.integers(1, 3))
    h, w = data.draw(st.integers(2, 4)), data.draw(st.integers(2, 4))
    attr = rand((b, 1, h, w), 0)
    mask = torch.zeros(b, h, w, dtype=torch.bool)
    mask[:, 0, 0] = True
    which = data.draw(st.sampled_from(["attributions", "masks", "absolute", "ties"]))
    kw = {}
    if which == "attributions":
        kind = data.draw(st.sampled_from(INPUT_KINDS + ("rank5",)))
        attr = (rand((1, b, 1, h, w), 1) if kind == "rank5"
                else data.draw(malformed_tensor((b, 1, h, w), (kind,))))
    elif which == "masks":
        kind = data.draw(st.sampled_from(["shape", "values", "nonfinite", "type", "complex",
                                          "empty"]))
        if kind == "shape":
            mask = torch.ones(data.draw(st.sampled_from(
                [(b, h + 1, w), (b + 1, h, w), (b, 2, h, w), (h, w), (b, h, w, 1)])),
                dtype=torch.bool)
        elif kind == "values":
            mask = torch.full((b, h, w), data.draw(st.sampled_from([2, -1, 0.5])))
        elif kind == "nonfinite":
            mask = torch.full((b, h, w), data.draw(st.sampled_from(NONFINITE)))
        elif kind == "type":
            mask = data.draw(st.sampled_from([mask.tolist(), mask.cpu().numpy(), None, 1]))
        elif kind == "complex":
            mask = mask.to(torch.complex64)
        else:  # one sample without any mask pixel
            mask[data.draw(st.integers(0, b - 1))] = False
    elif which == "absolute":
        kw["absolute"] = data.draw(NOT_BOOL)
    else:
        kw["ties"] = data.draw(st.one_of(st.text(max_size=8).filter(
            lambda s: s not in ("expected", "index")), st.none(), st.integers()))
    expect_error(lambda: M.bbox_accuracy(attr, mask, **kw), which)


@property_test(40, "metrics")
def test_infidelity_square_removal_refuses_misplaced_options(data):
    shape = data.draw(sample_shapes())
    x = rand(shape, 0)
    option = data.draw(st.sampled_from(["inputs", "n_perturb_samples", "noise_std"]))
    if option == "inputs":
        if len(shape) == 4:
            shape = shape[:2]
            x = rand(shape, 0)
        kw = {}
    else:
        if len(shape) != 4:
            shape = (shape[0], 1, 2, 2)
            x = rand(shape, 0)
        kw = {option: data.draw(st.sampled_from([1, 10, 0.2]))}
    expect_error(lambda: M.infidelity(mlp(n_features(shape)), x, torch.ones_like(x),
                                      perturbation="square", **kw), option)


# ------------------------------------------------------------------------------ audit
@property_test(40, "audit")
def test_audit_refuses_malformed_arguments(data):
    which = data.draw(st.sampled_from(["method", "seed", "method_kwargs", "models",
                                       "models inputs"]))
    if which == "method":
        method = data.draw(st.one_of(st.text(max_size=6).filter(lambda s: s not in METHODS),
                                     st.integers(), st.none(), st.just(nn.Linear),
                                     st.just([1])))
        expect_error(lambda: audit(method), "method")
    elif which == "seed":
        expect_error(lambda: audit("gradient_input", seed=data.draw(BAD_SEED)), "seed")
    elif which == "method_kwargs":
        kind = data.draw(st.sampled_from(["type", "value", "unknown"]))
        if kind == "type":
            expect_error(lambda: audit("gradient_input", method_kwargs=data.draw(
                st.sampled_from([[1], 3, "n_steps=4"]))), "method_kwargs")
        elif kind == "value":
            bad = data.draw(BAD_POSINT)
            expect_error(lambda: audit("integrated_gradients", method_kwargs={"n_steps": bad}),
                         "n_steps")
        else:
            expect_error(lambda: audit("integrated_gradients",
                                          method_kwargs={"n_stepz": 4}), "n_stepz")
    elif which == "models":
        bad = data.draw(st.sampled_from(["models", 3, [(mlp(4),)], [(mlp(4), rand((2, 4), 0), 1)],
                                         {"m": mlp(4)}, [3]]))
        expect_error(lambda: audit(_cheap_attribution, models=bad), "models")
    else:
        bad = data.draw(malformed_tensor((2, 4)))
        expect_error(lambda: audit(_cheap_attribution, models={"m": (mlp(4), bad)}),
                     "inputs")


# ------------------------------------------------------------------------------ CLI
VALIDATE_OPTIONS = ("--order", "--samples", "--models", "--mnist-dir", "--out", "--quick",
                    "--seed", "--help")


def _cli_cases(tmp_file: str):
    """``(argv, option named in the message)`` for malformed command lines."""
    bad_posint = st.sampled_from(["0", "-1", "x", "1.5", "", "1e3", "0x10"])
    bad_seed = st.sampled_from(["-1", "x", "1.5", "", str(2**63), "1e3"])
    cases = [
        st.tuples(st.just(["validate", "--order"]), bad_posint).map(
            lambda t: (t[0] + [t[1]], "--order")),
        st.tuples(st.just(["validate", "--samples"]), bad_posint).map(
            lambda t: (t[0] + [t[1]], "--samples")),
        st.text(min_size=1, max_size=6).filter(lambda s: s not in ("poly", "m_sg", "c_sg")
                                               and not s.startswith("-")).map(
            lambda s: (["validate", "--models", s], "--models")),
        st.tuples(st.sampled_from(["validate", "principles", "assess", "reproduce"]),
                  bad_seed).map(lambda t: ([t[0], "--seed", t[1]], "--seed")),
        st.sampled_from(["validate", "assess", "reproduce"]).map(
            lambda c: ([c, "--mnist-dir", "/nonexistent/dir"], "--mnist-dir")),
        st.sampled_from(["validate", "assess", "reproduce", "explain"]).map(
            lambda c: ([c] + ([tmp_file] if c == "explain" else []) + ["--out", tmp_file],
                       "--out")),
        st.sampled_from(["validate", "assess", "reproduce"]).map(
            lambda c: ([c, "--out"], "--out")),
        bad_posint.map(lambda v: (["assess", "--samples", v], "--samples")),
        st.text(min_size=1, max_size=6).filter(lambda s: not s.startswith("-")).filter(
            lambda s: s not in cli.ASSESS_EXPERIMENTS).map(
            lambda s: (["assess", "--experiment", s], "--experiment")),
        st.text(min_size=1, max_size=8).filter(lambda s: s not in cli.IMAGENET_MODELS).map(
            lambda s: (["assess", "--weights", f"{s}={tmp_file}"], "--weights")),
        st.sampled_from(cli.IMAGENET_MODELS).map(
            lambda m: (["assess", "--weights", f"{m}=/nonexistent.pt"], "--weights")),
        st.sampled_from(cli.IMAGENET_MODELS).map(  # weights without a folder to run them on
            lambda m: (["assess", "--weights", f"{m}={tmp_file}"], "--imagenet-dir")),
        st.just((["assess", "--imagenet-dir", "/nonexistent/dir"], "--imagenet-dir")),
        st.just((["reproduce", "--quick", "--full"], "--full")),
        st.just((["explain"], "image")),
        st.just((["explain", "/nonexistent/image.png"], "image")),
        st.text(min_size=1, max_size=8).filter(lambda s: s not in cli.EXPLAIN_MODELS
                                               and not s.startswith("-")).map(
            lambda s: (["explain", tmp_file, "--model", s], "--model")),
        st.sampled_from(["-1", "x", "1.5", ""]).map(
            lambda v: (["explain", tmp_file, "--target", v], "--target")),
        st.just((["explain", tmp_file, "--weights", "/nonexistent.pt"], "--weights")),
        st.just((["explain", tmp_file, "--weights", tmp_file], "--weights")),  # EfficientNet
        st.sampled_from(["vgg16", "vgg19", "resnet18"]).map(
            lambda m: (["explain", tmp_file, "--model", m], "--weights")),
        st.text(min_size=1, max_size=8).filter(lambda s: s not in cli.COMMANDS
                                               and not s.startswith("-")).map(
            lambda s: ([s], "command")),
        st.just(([], "command")),
        st.from_regex(r"--[a-z]{1,6}", fullmatch=True).filter(  # not an abbreviation either
            lambda s: not any(o.startswith(s) for o in VALIDATE_OPTIONS)).map(
            lambda s: (["validate", s], s)),
    ]
    return st.one_of(cases)


@pytest.fixture(scope="module")
def cli_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "image.png"
    path.write_bytes(b"not really an image")
    return str(path)


def test_malformed_command_lines_exit_2_naming_the_option(cli_file):
    def refuse(args):
        raise AssertionError(f"a command ran for the malformed command line {args}")

    @budget(120)
    @given(case=_cli_cases(cli_file))
    def check(case):
        CASES["cli"] += 1
        argv, option = case
        err = io.StringIO()
        with mock.patch.dict(cli.COMMANDS, {k: refuse for k in cli.COMMANDS}), \
                contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), \
                pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
        assert exit_info.value.code == 2, (argv, err.getvalue())
        assert option in err.getvalue(), (argv, err.getvalue())

    check()


# ------------------------------------------------------------------------------ once-known failures
@pytest.mark.parametrize("name", ["method:deeplift", "method:epsilon_lrp",
                                  "reformulate:deeplift", "reformulate:epsilon_lrp"])
def test_layerwise_methods_refuse_inputs_the_model_cannot_take(name):
    expect_error(lambda: ENTRIES[name].call(mlp(4), rand((2, 5), 0)), "inputs")


@pytest.mark.parametrize("name", ["occlusion_1", "occlusion_patch", "integrated_gradients",
                                  "expected_gradients"])
def test_methods_refuse_a_model_that_is_non_finite_away_from_the_inputs(name):
    # finite at x in [0, 1), but (1e200)^2 overflows at the baseline
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3), Square(), nn.Linear(3, 2)).to(D).eval()
    x = rand((2, 4), 0)
    kw = ({"baselines": torch.full((3, 4), 1e200, dtype=D), "n_samples": 4}
          if name == "expected_gradients" else {"baselines": 1e200})
    expect_error(lambda: METHODS[name](model, x, **kw), "model")


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.complex64])
def test_expected_gradients_refuses_a_reference_of_the_wrong_dtype(dtype):
    expect_error(lambda: METHODS["expected_gradients"](
        mlp(4), rand((2, 4), 0), baselines=torch.ones(3, 4, dtype=dtype), n_samples=2),
        "baselines")


# ------------------------------------------------------------------------------ regression
def test_occlusion_reformulation_uses_the_windows_of_occlusion_on_volumes():
    """An int patch on ``[B, C, D, H, W]`` occludes D, H and W in both (was only W)."""
    with _seeded(0):
        model = nn.Sequential(nn.Flatten(), nn.Linear(2 * 3 * 4 * 4, 5), Square(),
                              nn.Linear(5, 3)).to(D).eval()
    x = rand((2, 2, 3, 4, 4), 0)
    original = METHODS["occlusion_patch"](model, x, baselines=0.0, patch=2)
    torch.testing.assert_close(ta.reformulate("occlusion_patch", model, x, 0.0, patch=2),
                               original, rtol=1e-9, atol=1e-12)


def test_generated_case_count(request):
    """At least 1,000 generated malformed cases across the suite (when it runs whole)."""
    total = sum(CASES.values())
    if request.config.option.keyword or request.config.option.markexpr or total == 0:
        return  # the module ran partially: the count is only meaningful for the whole module
    if hasattr(request.config, "workerinput") and request.config.getoption(
            "dist", "no") not in ("loadfile", "loadscope"):
        return  # pytest-xdist shares the module's tests out to several processes
    with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
        print(f"\n[test_robustness] generated malformed cases: {total} "
              f"{dict(sorted(CASES.items()))}")
    assert total >= 1000, dict(CASES)
