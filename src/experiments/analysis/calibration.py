"""How far a classifier's confidence can be trusted: expected calibration error (ECE),
temperature scaling (Guo et al., 2017, "On Calibration of Modern Neural Networks") with the
safeguards that keep it from making probabilities worse, and the reliability diagram."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from matplotlib.figure import Figure  # object API: no global backend or pyplot state

BINS = 15  # as Guo et al.: equal-width confidence bins over [0, 1]
# The temperatures a fit may return. Guo et al. fit T between about 1 and 3 on ImageNet and
# CIFAR nets; 0.05 (logits x 20) and 20 (logits / 20) leave a wide margin around that while
# excluding the two degenerate limits the NLL runs to on bad validation data: T -> 0 (every
# probability 1.000, the optimum when every validation sample is right) and T -> infinity
# (every probability 1/K).
T_RANGE = (0.05, 20.0)
# Smallest validation split T is fitted on: NLL is driven by the few confident mistakes, and
# below these counts a handful of samples decides T. 20 per class is the rule checkpoint
# choice warns with (StateDictCheckpoint.min_val_per_class), so one split is "too small" for
# both.
MIN_SAMPLES = 100
MIN_PER_CLASS = 20


def calibration_bins(probs: torch.Tensor, labels: torch.Tensor, bins: int = BINS):
    """Per confidence bin: ``(count, mean confidence, accuracy)``, each a ``(bins,)``
    tensor (0 where a bin is empty). ``probs``: (N, K) rows summing to 1; ``labels``: (N,)."""
    confidence, predicted = probs.max(dim=1)
    correct = (predicted == labels).double()
    index = (confidence * bins).long().clamp_(0, bins - 1)  # bin b holds (b/bins, (b+1)/bins]
    count = torch.bincount(index, minlength=bins).double()
    conf_sum = torch.bincount(index, weights=confidence.double(), minlength=bins)
    correct_sum = torch.bincount(index, weights=correct, minlength=bins)
    safe = count.clamp_min(1)
    return count, conf_sum / safe, correct_sum / safe


def expected_calibration_error(probs: torch.Tensor, labels: torch.Tensor, bins: int = BINS):
    """Σ_b (n_b / N) |accuracy_b - confidence_b|: 0 when confidence matches accuracy."""
    count, confidence, accuracy = calibration_bins(probs, labels, bins)
    return float((count / count.sum().clamp_min(1) * (accuracy - confidence).abs()).sum())


def nll(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> float:
    return float(torch.nn.functional.cross_entropy(logits.double() / temperature, labels.long()))


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The T in ``T_RANGE`` that minimizes the NLL of ``softmax(logits / T)``: one number,
    fitted on held-out data, that leaves every prediction (the argmax) as it is.

    The NLL is convex in 1/T, so it has one minimum along log T; a golden-section search
    over log T finds it, or the bound it lies beyond, without the divergence an unbounded
    optimizer shows when the minimum is at T -> 0."""
    logits, labels = logits.double(), labels.long()  # once: the search reads them ~40 times

    def loss(log_t: float) -> float:
        return nll(logits, labels, math.exp(log_t))

    low, high = math.log(T_RANGE[0]), math.log(T_RANGE[1])
    ratio = (math.sqrt(5) - 1) / 2
    a, b = high - ratio * (high - low), low + ratio * (high - low)
    fa, fb = loss(a), loss(b)
    for _ in range(80):  # the bracket shrinks to 0.618**80 of log(400): far below a float's step
        if fa <= fb:
            high, b, fb = b, a, fa
            a = high - ratio * (high - low)
            fa = loss(a)
        else:
            low, a, fa = a, b, fb
            b = low + ratio * (high - low)
            fb = loss(b)
    best = min((loss(x), x) for x in (math.log(T_RANGE[0]), (low + high) / 2, math.log(T_RANGE[1])))
    return float(min(max(math.exp(best[1]), T_RANGE[0]), T_RANGE[1]))


@dataclass
class TemperatureChoice:
    """What ``choose_temperature`` decided: the T to apply (1.0 when kept), the T the fit
    found (None when it was not run), why, and the numbers the decision rests on."""

    temperature: float
    fitted: float | None
    reason: str
    cross_fit: list[dict] = field(default_factory=list)

    @property
    def applied(self) -> bool:
        return self.temperature != 1.0


def choose_temperature(logits: torch.Tensor, labels: torch.Tensor) -> TemperatureChoice:
    """Fit T on a validation split's ``logits`` (N, K) and ``labels`` (N,), or keep T = 1
    when the split cannot support a fit: too small (``MIN_SAMPLES`` in all,
    ``MIN_PER_CLASS`` of each class), saturated (every sample right: the NLL falls to 0 as
    T -> 0, so its minimum says nothing about T), a fit at the bound of ``T_RANGE``, or a
    cross-fitted check (T fitted on one half raises the NLL of the other, either way)."""
    labels = labels.long()
    n = int(labels.numel())
    advice = "use a larger data.val_fraction"
    refused = []
    if bool((logits.argmax(dim=1) == labels).all()):
        refused.append(
            f"validation split saturated: all {n} samples right, so its NLL falls to 0 as "
            f"T -> 0 and cannot choose T"
        )
    fewest = int(torch.bincount(labels, minlength=int(logits.shape[1])).min())
    if n < MIN_SAMPLES or fewest < MIN_PER_CLASS:
        refused.append(
            f"validation split too small to fit T: {n} samples, {fewest} in its smallest "
            f"class (T needs >= {MIN_SAMPLES} in all and >= {MIN_PER_CLASS} per class)"
        )
    if refused:
        return TemperatureChoice(1.0, None, "; ".join(refused) + f"; {advice}")
    fitted = fit_temperature(logits, labels)
    if not T_RANGE[0] * 1.001 < fitted < T_RANGE[1] / 1.001:
        why = (f"the NLL-minimizing T is at the bound of [{T_RANGE[0]:g}, {T_RANGE[1]:g}] "
               f"({fitted:.4g}): the validation split does not pin T down; {advice}")  # fmt: skip
        return TemperatureChoice(1.0, fitted, why)
    checks = _cross_fit(logits, labels)
    c = next((c for c in checks if c["nll_after"] > c["nll_before"]), None)
    if c is not None:
        why = (f"a cross-fitted check on validation shows NLL rising: T = {c['temperature']:.4g} "
               f"fitted on one half raises the other half's NLL {c['nll_before']:.4f} -> "
               f"{c['nll_after']:.4f}")  # fmt: skip
        return TemperatureChoice(1.0, fitted, why, checks)
    shown = ", ".join(f"{c['nll_before']:.4f} -> {c['nll_after']:.4f}" for c in checks)
    why = (f"fitted on the validation split; a cross-fitted check (T fitted on each half, NLL on "
           f"the other) lowers NLL both ways: {shown}")  # fmt: skip
    return TemperatureChoice(fitted, fitted, why, checks)


def _cross_fit(logits: torch.Tensor, labels: torch.Tensor) -> list[dict]:
    """Fit T on one half of the split and measure the other half's NLL at 1 and at that T,
    both ways. The halves alternate within each class (stratified, no randomness)."""
    order = torch.argsort(labels, stable=True)
    halves = (order[0::2], order[1::2])
    checks = []
    for fit_on, check_on in (halves, halves[::-1]):
        t = fit_temperature(logits[fit_on], labels[fit_on])
        checks.append({
            "temperature": t,
            "n_fit": int(fit_on.numel()),
            "n_check": int(check_on.numel()),
            "nll_before": nll(logits[check_on], labels[check_on]),
            "nll_after": nll(logits[check_on], labels[check_on], t),
        })  # fmt: skip
    return checks


def reliability_diagram(path: Path, curves: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> Path:
    """Accuracy against confidence per bin, one line per ``name: (probs, labels)``; the
    diagonal is perfect calibration."""
    fig = Figure(figsize=(4.5, 4.5))
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="calibrated")
    for name, (probs, labels) in curves.items():
        count, confidence, accuracy = calibration_bins(probs, labels)
        used = count > 0
        ece = expected_calibration_error(probs, labels)
        ax.plot(confidence[used], accuracy[used], marker="o", label=f"{name} (ECE {ece:.3f})")
    ax.set(xlabel="confidence", ylabel="accuracy", xlim=(0, 1), ylim=(0, 1))
    ax.set_title(f"reliability ({BINS} bins)")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
