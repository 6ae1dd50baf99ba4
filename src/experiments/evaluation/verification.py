"""``python -m experiments.verify``: train a finished run again from its saved overrides in a
temporary folder and say whether it comes out the same -- metrics and weights bit for bit
on the machine that ran it, within a printed tolerance on another. ``integrity=true``
instead checks, in seconds and without training, that the run's (or a sweep's) files are
the ones its ``manifest.json`` lists."""

from __future__ import annotations

import csv
import io
import math
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from experiments.errors import UserError, one_line
from experiments.recorded.replay import read_overrides
from experiments.runs.files import read_json_object, read_text
from experiments.runs.layout import (
    ENV,
    GIT_DIFF,
    HYDRA,
    MANIFEST,
    METRICS,
    SAVED_OVERRIDES,
    WEIGHTS_ROLES,
    RunDir,
)
from experiments.runs.manifest import check_tree
from experiments.runs.provenance import start_git_probe

VOLATILE = ("wall_time_s", "run_dir", "seed", "epochs", "global_step")  # not results
# what env.json must hold for verify to read it: key -> the types its value may have
ENV_TYPES = {"hostname": (str, type(None)), "git_commit": (str, type(None)),
             "git_dirty": (bool, type(None))}  # fmt: skip
TOLERANCE = 1e-5  # relative, when another machine runs it
MAX_CSV_BYTES = 256 * 1024 * 1024  # a long run's csv/metrics.csv: a row per logged step


def verify(run_dir: str | Path, steps: int | None = None) -> dict:
    """Re-run and compare; returns ``{"match", "exact", "compared", "differences", "notes"}``.

    Every file of the run is read as data (``experiments.runs.files``) before anything runs;
    its overrides are checked entry by entry (``experiments.recorded.replay``).

    Raises:
        UserError: no env.json or saved overrides, a corrupt or refused file, a dirty run
            without git.diff, a run with nothing to compare.
    """
    layout = RunDir(run_dir)
    if not layout.path.is_dir():
        raise UserError(f"run_dir={layout.path}: no such folder")
    env = read_json_object(layout.env)
    if not env or not layout.saved_overrides.is_file():
        raise UserError(
            f"{layout.path}: no saved command to verify ({ENV} and {HYDRA}/{SAVED_OVERRIDES} "
            f"are written when python -m experiments.train starts a run)"
        )
    for key, types in ENV_TYPES.items():  # what verify reads of it
        if not isinstance(env.get(key), types):
            raise UserError(
                f"{layout.env}: {key} is a {type(env.get(key)).__name__}, not what a run "
                f"writes there; restore the file"
            )
    overrides = read_overrides(layout.saved_overrides)  # refused entries: before anything runs
    if env.get("git_dirty") and not layout.git_diff.is_file():
        raise UserError(
            f"{layout.path}: the run started from uncommitted changes and its {GIT_DIFF} is "
            f"missing, so the code it ran cannot be known"
        )
    if steps is None:
        if not layout.metrics.is_file():
            raise UserError(f"{layout.path}: the run did not finish (no {METRICS}); give steps=N")
        if not _metric_keys(read_json_object(layout.metrics)):
            raise UserError(
                f"{layout.metrics}: holds no metric values to compare (a run writes its "
                f"final metrics there); restore the file, or verify steps=N"
            )
    exact = env.get("hostname") == socket.gethostname()
    notes = []
    here = start_git_probe()().get("git_commit")
    if env.get("git_commit") and here and here != env["git_commit"]:
        notes.append(f"the code here is commit {here[:10]}, the run's was {env['git_commit'][:10]}")
    if env.get("git_dirty"):
        notes.append(
            f"the run had uncommitted changes ({GIT_DIFF}); the code here is used as it is"
        )
    with tempfile.TemporaryDirectory(prefix="verify-") as tmp:
        again = Path(tmp) / "run"
        extra = [f"++trainer.max_steps={steps}", "test=false"] if steps else []
        out = subprocess.run(
            [sys.executable, "-m", "experiments.train", *overrides, *extra,
             f"hydra.run.dir={again}"],
            capture_output=True, text=True,
        )  # fmt: skip
        if out.returncode:
            tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["?"]
            raise UserError(f"the run could not be trained again: {tail[0][:300]}")
        if steps:
            compared, differences = _losses(layout, RunDir(again), steps, exact)
        else:
            compared, differences = _metrics(layout, RunDir(again), exact)
            for role in WEIGHTS_ROLES:
                first, second = layout.weights(role), RunDir(again).weights(role)
                if not first.is_file() and not second.is_file():
                    continue  # the run's config saves no such file: nothing it ever had
                n, diff = _weights(first, second, exact)
                compared.append(f"{first.name} ({n} tensors)")
                differences += diff
            if not any(RunDir(again).weights(r).is_file() for r in WEIGHTS_ROLES):
                notes.append(
                    "the run's config saves no weights (e.g. debug=fast, or the checkpoint "
                    "callback off): verified on its metrics only"
                )
    return {"match": not differences, "exact": exact, "compared": compared,
            "differences": differences, "notes": notes}  # fmt: skip


def _metric_keys(metrics: dict) -> list[str]:
    """The keys of ``metrics`` that are results (numbers), not where or how long."""
    return [
        k
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and k not in VOLATILE
    ]


def _same(a: float, b: float, exact: bool) -> bool:
    if exact:
        return a == b or (math.isnan(a) and math.isnan(b))
    return math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=1e-12)


def _metrics(first: RunDir, again: RunDir, exact: bool):
    a, b = read_json_object(first.metrics), read_json_object(again.metrics)
    keys = _metric_keys(a)
    diffs = [
        f"{METRICS} {k}: {a[k]!r} then, {b.get(k)!r} now"
        for k in keys
        if not isinstance(b.get(k), int | float) or not _same(float(a[k]), float(b[k]), exact)
    ]
    return [f"{METRICS} ({len(keys)} values)"], diffs


def _weights(first: Path, again: Path, exact: bool) -> tuple[int, list[str]]:
    # lazy: torch takes seconds to import, and integrity=true never needs it
    import torch

    from experiments.runs.weights import safe_load  # lazy: imports torch (see above)

    if not first.is_file():
        return 0, [f"{first.name}: missing from the run (training again writes it)"]
    if not again.is_file():
        return 0, [f"{first.name}: in the run, but training again writes no such file"]
    try:  # safetensors, or torch.load(weights_only=True): a tensor file, never code
        a = safe_load(first)
    except UserError as err:
        return 0, [f"{first.name}: cannot be read ({one_line(err)[:160]})"]
    b = safe_load(again)
    a = a.get("state_dict", a) if isinstance(a, dict) else a
    b = b.get("state_dict", b)
    if not isinstance(a, dict) or not any(isinstance(x, torch.Tensor) for x in a.values()):
        return 0, [f"{first.name}: holds no tensors to compare"]
    diffs = [f"{first.name} {k}: missing from the run" for k in b if k not in a]
    for key, x in a.items():
        y = b.get(key)
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
                diffs.append(f"{first.name} {key}: a tensor in only one of the two")
            continue
        same = torch.equal(x, y) if exact else (
            x.shape == y.shape and torch.allclose(x.double(), y.double(), rtol=TOLERANCE)
        )  # fmt: skip
        if not same:
            gap = (x.double() - y.double()).abs().max().item() if x.shape == y.shape else "shape"
            diffs.append(f"{first.name} {key}: differs (max |difference| {gap})")
    return len(a), diffs[:10] + ([f"... and {len(diffs) - 10} more"] if len(diffs) > 10 else [])


def _losses(first: RunDir, again: RunDir, steps: int, exact: bool):
    a, b = _step_losses(first, steps), _step_losses(again, steps)
    if not a:
        raise UserError(
            f"{first.csv_metrics}: no train/loss_step logged in the first {steps} steps "
            f"(logged every trainer.log_every_n_steps): give more steps or verify the whole run"
        )
    diffs = [f"train/loss_step at step {s}: {v!r} then, {b.get(s)!r} now"
             for s, v in a.items() if b.get(s) is None or not _same(v, b[s], exact)]  # fmt: skip
    return [f"train/loss_step at {len(a)} steps"], diffs


def _step_losses(run: RunDir, steps: int) -> dict[int, float]:
    path, found = run.csv_metrics, {}
    if not path.is_file():
        return found
    text = read_text(path, max_bytes=MAX_CSV_BYTES)  # a corrupt file: one line naming it
    try:
        for row in csv.DictReader(io.StringIO(text, newline="")):
            if row.get("train/loss_step") and row.get("step") and int(row["step"]) < steps:
                found[int(row["step"])] = float(row["train/loss_step"])
    except (ValueError, csv.Error) as err:
        raise UserError(f"{path}: not the CSV a run writes ({one_line(err)})") from None
    return found


def integrity(folder: str | Path) -> tuple[bool, list[str]]:
    """Check ``folder`` (a run or a sweep, with each job in it) against its manifest(s),
    training nothing. Returns ``(ok, lines to print)``; ok is False only when a listed file
    was modified or removed, or one was added, in a folder that has a manifest."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"run_dir={folder}: no such folder")
    results = check_tree(folder)
    lines, ok = [], True
    for result in results:
        if not result.has_manifest:
            lines += [f"note: {line}" for line in result.lines()]
        elif result.intact:
            matched = f"{result.checked} files match {MANIFEST}: sha256 and size"
            lines.append(f"intact: {result.folder} ({matched})")
        else:
            ok = False
            found = result.lines()
            lines.append(f"NOT intact: {result.folder}: {len(found)} differences")
            lines += [f"  {line}" for line in found]
    return ok, lines


def command(options: dict, overrides: list[str]) -> int:
    """``python -m experiments.verify``'s work, once ``cli`` has parsed its arguments: the
    exit code (0 verified or intact, 1 not)."""
    if options["integrity"]:
        ok, lines = integrity(options["run_dir"])
        print("\n".join(lines))
        return 0 if ok else 1
    report = verify(options["run_dir"], options["steps"])
    how = "bit for bit" if report["exact"] else f"within a relative {TOLERANCE:g} (another machine)"
    for note in report["notes"]:
        print(f"note: {note}")
    if report["match"]:
        print(f"verified: {', '.join(report['compared'])} match {how}")
        return 0
    print(f"NOT verified ({how} expected): {len(report['differences'])} differences")
    for line in report["differences"]:
        print(f"  {line}")
    return 1
