"""How far a classifier's confidence can be trusted: expected calibration error (ECE),
temperature scaling (Guo et al., 2017, "On Calibration of Modern Neural Networks") and
the reliability diagram."""

from __future__ import annotations

from pathlib import Path

import torch

BINS = 15  # as Guo et al.: equal-width confidence bins over [0, 1]


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
    return float(torch.nn.functional.cross_entropy(logits.double() / temperature, labels))


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The T > 0 that minimizes the NLL of ``softmax(logits / T)``: one number, fitted on
    held-out data, that leaves every prediction (the argmax) as it is."""
    logits, labels = logits.double(), labels.long()
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.1, max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(logits / log_t.exp(), labels)
        loss.backward()
        return loss

    opt.step(closure)
    return float(log_t.detach().exp())


def reliability_diagram(path: Path, curves: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> Path:
    """Accuracy against confidence per bin, one line per ``name: (probs, labels)``; the
    diagonal is perfect calibration."""
    from matplotlib.figure import Figure  # object API: no global backend or pyplot state

    fig = Figure(figsize=(4.5, 4.5))
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="calibrated")
    for name, (probs, labels) in curves.items():
        count, confidence, accuracy = calibration_bins(probs, labels)
        used = count > 0
        ece = expected_calibration_error(probs, labels)
        ax.plot(confidence[used], accuracy[used], marker="o", label=f"{name} (ECE {ece:.3f})")
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(f"reliability ({BINS} bins)")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
