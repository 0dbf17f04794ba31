"""Captum's streaming statistics of attributions: ``Summarizer``, ``ClassSummarizer`` and the
statistics ``Count``, ``Mean``, ``MSE``, ``Var``, ``StdDev``, ``Min``, ``Max``, ``Sum``.

``update(x)`` adds one tensor ``x_k`` (``k = 1..n``) to every statistic; ``summary`` maps each
statistic's ``name`` to its value. The moments are Welford's updates, as Captum's:

    mean_n = mean_{n-1} + (x_n - mean_{n-1}) / n
    M2_n   = M2_{n-1} + (x_n - mean_{n-1}) (x_n - mean_n)          (``MSE``)
    Var    = M2_n / (n - order)   (0 while n <= order; float64),   StdDev = sqrt(Var)

``Min``, ``Max`` and ``Sum`` fold ``fn(result, x)`` (``torch.min``, ``torch.max``,
``torch.add`` by default). A statistic that needs another (``Var`` needs ``MSE`` and
``Count``) finds it in the summarizer that holds it: two statistics of one class and
parameters are the same statistic.
"""
from __future__ import annotations

import copy
from collections import defaultdict

import torch

__all__ = ["MSE", "ClassSummarizer", "CommonStats", "Count", "Max", "Mean", "Min", "Stat",
           "StatValue", "StdDev", "Sum", "Summarizer", "SummarizerSingleTensor", "Var"]

StatValue = torch.Tensor | int | float  # Captum's alias: what a statistic's ``get`` returns


class Stat:
    """A statistic updated tensor by tensor (Captum's ``Stat``); equal (and hashed alike)
    to every statistic of its class with the same parameters."""

    needs: tuple = ()  # the statistics this one reads, as factories of (self)

    def __init__(self, name: str | None = None, **params) -> None:
        self.params = params
        self._name = name
        self._other_stats = None

    def init(self) -> None:
        """Find the statistics this one reads in its summarizer."""

    def _get_stat(self, stat):
        return self._other_stats.get(stat)

    def update(self, x: torch.Tensor) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define update(x)")

    def get(self):
        raise NotImplementedError(f"{type(self).__name__} must define get()")

    def __hash__(self) -> int:
        return hash((type(self), frozenset(self.params.items())))

    def __eq__(self, other) -> bool:
        return isinstance(other, Stat) and type(self) is type(other) and \
            self.params == other.params

    @property
    def name(self) -> str:
        """The key of this statistic in ``summary``: the given name, or the class name in
        lower case with its parameters."""
        if self._name is not None:
            return self._name
        return type(self).__name__.lower() + (f"({self.params})" if self.params else "")


class Count(Stat):
    """``n``, the number of updates."""

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name=name)
        self.n = None

    def update(self, x) -> None:
        self.n = (self.n or 0) + 1

    def get(self):
        return self.n


class Mean(Stat):
    """The running mean (float64 for integer tensors)."""

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name=name)
        self.rolling_mean = None
        self.n = None

    def init(self) -> None:
        self.n = self._get_stat(Count())

    def update(self, x) -> None:
        if self.rolling_mean is None:
            self.rolling_mean = x.clone() if x.is_floating_point() else x.double()
        else:
            self.rolling_mean = self.rolling_mean + (x - self.rolling_mean) / self.n.get()

    def get(self):
        return self.rolling_mean


class MSE(Stat):
    """Welford's ``M2``, the sum of squared deviations from the mean."""

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name=name)
        self.prev_mean = None
        self.mse = None
        self.mean = None

    def init(self) -> None:
        self.mean = self._get_stat(Mean())

    def update(self, x) -> None:
        mean = self.mean.get()
        if self.prev_mean is not None:
            step = (x - self.prev_mean) * (x - mean)
            self.mse = step if self.mse is None else self.mse + step
        self.prev_mean = mean.clone()

    def get(self):
        if self.mse is None and self.prev_mean is not None:
            return torch.zeros_like(self.prev_mean)
        return self.mse


class Var(Stat):
    """``M2 / (n - order)`` in float64 (``order=1``: the sample variance)."""

    def __init__(self, name: str | None = None, order: int = 0) -> None:
        if name is None:
            name = {0: "variance", 1: "sample_variance"}.get(order, f"variance({order})")
        super().__init__(name=name, order=order)
        self.order = order
        self.mse_stat = self.n_stat = None

    def init(self) -> None:
        self.mse_stat, self.n_stat = self._get_stat(MSE()), self._get_stat(Count())

    def update(self, x) -> None:
        pass

    def get(self):
        mse, n = self.mse_stat.get(), self.n_stat.get()
        if mse is None:
            return None
        if n is None or n <= self.order:
            return torch.zeros_like(mse)
        return mse.to(torch.float64) / (n - self.order)


class StdDev(Stat):
    """``sqrt(Var(order))``."""

    def __init__(self, name: str | None = None, order: int = 0) -> None:
        if name is None:
            # Captum's names, its unbalanced parenthesis included
            name = {0: "std_dev", 1: "sample_std_dev"}.get(order, f"std_dev{order})")
        super().__init__(name=name, order=order)
        self.order = order
        self.var_stat = None

    def init(self) -> None:
        self.var_stat = self._get_stat(Var(order=self.order))

    def update(self, x) -> None:
        pass

    def get(self):
        var = self.var_stat.get()
        return None if var is None else torch.pow(var, 0.5)


class _Fold(Stat):
    """``result = fn(result, x)``, the first ``x`` as it is."""

    def __init__(self, name: str | None, fn) -> None:
        super().__init__(name=name)
        self.fn, self.result = fn, None

    def update(self, x) -> None:
        self.result = x if self.result is None else self.fn(self.result, x)

    def get(self):
        return self.result


class Min(_Fold):
    def __init__(self, name: str | None = None, min_fn=torch.min) -> None:
        super().__init__(name, min_fn)


class Max(_Fold):
    def __init__(self, name: str | None = None, max_fn=torch.max) -> None:
        super().__init__(name, max_fn)


class Sum(_Fold):
    def __init__(self, name: str | None = None, add_fn=torch.add) -> None:
        super().__init__(name, add_fn)


def CommonStats() -> list:
    """Mean, sample variance, sample standard deviation, min and max."""
    return [Mean(), Var(order=1), StdDev(order=1), Min(), Max()]


# the order in which dependent statistics update: a statistic after those it reads
_ORDER = {Count: 0, Mean: 1, MSE: 2, Var: 3, StdDev: 4}


def _with_dependencies(stats: list) -> tuple[list, list]:
    """Every statistic the given ones read added, in update order; and the indices of the
    given ones (those ``summary`` shows)."""
    wanted = list(dict.fromkeys(stats))
    every = set(wanted)
    every.update(Var(order=s.order) for s in wanted if isinstance(s, StdDev))
    moments = [cls for cls in _ORDER if any(type(s) is cls for s in every)]
    if moments:  # everything below the highest moment asked for
        top = max(_ORDER[c] for c in moments)
        every.update(cls() for cls, rank in _ORDER.items() if rank < top and cls is not Var)
    ordered = sorted(every, key=lambda s: _ORDER.get(type(s), 5))
    return ordered, [i for i, s in enumerate(ordered) if s in set(wanted)]


class SummarizerSingleTensor:
    """The statistics of one tensor: ``stats`` in update order, ``summary_stats_indices``
    the ones ``summary`` shows."""

    def __init__(self, stats: list, summary_stats_indices: list) -> None:
        self._stats = stats
        self._stat_to_stat = {s: s for s in stats}
        self._summary_stats = [stats[i] for i in summary_stats_indices]
        for s in stats:
            s._other_stats = self
            s.init()

    def update(self, x: torch.Tensor) -> None:
        for s in self._stats:
            s.update(x)

    def get(self, stat):
        """This summarizer's statistic equal to ``stat`` (None if it holds none)."""
        return self._stat_to_stat.get(stat)

    @property
    def summary(self) -> dict:
        return {s.name: s.get() for s in self._summary_stats}


class Summarizer:
    """Statistics of a tensor, or of every tensor of a tuple, over the updates."""

    def __init__(self, stats: list) -> None:
        self._summarizers: list = []
        self._is_inputs_tuple = None
        self._stats, self._summary_stats_indicies = _with_dependencies(stats)

    def update(self, x) -> None:
        """Add ``x`` (a tensor, a number or a tuple of them, the same form every time)."""
        if self._is_inputs_tuple is None:
            self._is_inputs_tuple = isinstance(x, tuple)
        elif self._is_inputs_tuple != isinstance(x, tuple):
            raise ValueError("Summarizer.update: give a tuple every time or never (the first "
                             f"update {'was' if self._is_inputs_tuple else 'was not'} one)")
        for i, part in enumerate(x if isinstance(x, tuple) else (x,)):
            if i >= len(self._summarizers):
                self._summarizers.append(SummarizerSingleTensor(
                    copy.deepcopy(self._stats), self._summary_stats_indicies))
            if not isinstance(part, torch.Tensor):
                part = torch.tensor(part, dtype=torch.float, device=torch.get_default_device())
            self._summarizers[i].update(part)

    @property
    def summary(self):
        """``{name: value}``, a list of them for tuple updates; None before any update."""
        if not self._summarizers:
            return None
        out = [s.summary for s in self._summarizers]
        return out if self._is_inputs_tuple else out[0]


class ClassSummarizer(Summarizer):
    """A :class:`Summarizer` of every sample, and one per label (``class_summaries``)."""

    def __init__(self, stats: list) -> None:
        super().__init__(stats)
        self.summaries = defaultdict(lambda: Summarizer(stats=stats))

    def update(self, x, labels=None) -> None:
        """Add every sample of ``x`` (``[B, ...]`` or a tuple of them) to the whole summary and
        to its label's (``labels``: one for all, or one per sample); no labels: ``x`` is
        added as one update."""
        if labels is None:
            super().update(x)
            return
        parts = x if isinstance(x, tuple) else (x,)
        many = isinstance(labels, (list, torch.Tensor))
        labels = labels if many else [labels]
        if len(labels) > 1 and any(p.shape[0] != len(labels) for p in parts):
            raise ValueError(f"labels: give one label or one per sample ({parts[0].shape[0]}),"
                             f" got {len(labels)}")
        for i in range(parts[0].shape[0]):
            label = labels[0] if len(labels) == 1 else labels[i]
            self.summaries[label].update(tuple(p[i] for p in parts))
            super().update(tuple(p[i].clone() for p in parts))

    @property
    def class_summaries(self) -> dict:
        return {key: value.summary for key, value in self.summaries.items()}
