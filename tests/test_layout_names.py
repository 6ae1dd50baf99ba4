"""One place spells each run-folder and sweep-folder file name: ``runs/layout.py``
(``RunDir``, ``SweepDir``). Every other module names the attribute, so a renamed file is a
one-line change and a reader finds every file of a run in one class."""

from __future__ import annotations

import ast
from pathlib import Path

from experiments.runs.layout import RunDir, SweepDir

SRC = Path(__file__).resolve().parents[1] / "src"  # the package and its Hydra plugins
LAYOUT = {"experiments/runs/layout.py"}
# the files of a run folder and of a sweep folder (see RunDir's and SweepDir's docstrings)
NAMES = (
    "metrics.json",
    "metrics.previous.json",
    "eval_metrics.json",
    "calibration.json",
    "reliability.png",
    "export.json",
    "model.onnx",
    "model.torchscript.pt",
    "model_card.md",
    "env.json",
    "git.diff",
    "reproduce.sh",
    "manifest.json",
    "predictions.csv",
    "data_counts.json",
    "data_stats.json",
    "cv.md",
    "last.ckpt",
    "best.pt",
    "last.pt",
    "best.safetensors",
    "last.safetensors",
    "best.json",
    "last.json",
    "sweep.json",
    "job.json",
    "summary.md",
    "summary.csv",
    "parallel.png",
    "contour.png",
    "summary.png",
)
# modules another change owns that still spell a name (module -> names): each entry must
# still be hit, so it is removed here once that module names the attribute instead
PENDING: dict[str, set[str]] = {}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (prose may name a file)."""
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = body[0] if body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def spelled(root: Path = SRC) -> dict[str, list[tuple[int, str]]]:
    """``module -> [(line, name)]`` for each string constant (f-string parts included,
    docstrings not) outside the layout module that holds a run-folder file name."""
    found: dict[str, list[tuple[int, str]]] = {}
    for path in sorted(root.rglob("*.py")):
        module = path.relative_to(root).as_posix()
        if module in LAYOUT:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if id(node) in skip:
                continue
            for name in NAMES:
                if name in node.value:
                    found.setdefault(module, []).append((node.lineno, name))
    return found


def test_only_the_layout_spells_a_run_folder_file_name():
    found = spelled()
    pending_hit = {m: {n for _, n in hits} & PENDING.get(m, set()) for m, hits in found.items()}
    bad = [
        f"{module}:{line}: {name!r}"
        for module, hits in found.items()
        for line, name in hits
        if name not in PENDING.get(module, set())
    ]
    assert not bad, "spell these through RunDir/SweepDir:\n" + "\n".join(bad)
    stale = {m: n - pending_hit.get(m, set()) for m, n in PENDING.items() if (SRC / m).is_file()}
    assert not any(stale.values()), f"no longer spelled there; drop from PENDING: {stale}"


def test_the_scan_finds_a_name_spelled_outside(tmp_path):
    # the test above can fail: a module that spells one is listed with its line
    (tmp_path / "experiments" / "runs").mkdir(parents=True)
    (tmp_path / "experiments" / "runs" / "layout.py").write_text('X = "metrics.json"\n')
    (tmp_path / "hydra_plugins.py").write_text(
        '"""Writes metrics.json (prose is fine)."""\n'
        "def f(run):\n"
        '    """best.json too."""\n'
        '    return run / "checkpoints" / f"{1}last.ckpt"\n'
    )
    assert spelled(tmp_path) == {"hydra_plugins.py": [(4, "last.ckpt")]}


def test_every_name_is_spelled_in_the_layout():
    text = (SRC / "experiments" / "runs" / "layout.py").read_text()
    missing = [n for n in NAMES if n not in text]
    assert not missing
    run, sweep = RunDir(Path("r")), SweepDir(Path("s"))
    assert run.metrics.name == "metrics.json" and sweep.summary_md.name == "summary.md"
    assert sweep.job_file(Path("s/0")).name == "job.json"
    assert sweep.summary_png.name == "summary.png" and sweep.contour_png.parent == sweep.path
