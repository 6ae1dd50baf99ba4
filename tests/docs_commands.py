"""Docs are code: every shell command in README.md and docs/*.md, run in a sandbox by
tests/test_docs_commands_*.py unless marked not run with why (``<!-- not run: why -->`` before
its block, ``(not run here: why)`` / ``# not run here: why`` at the end of its line)."""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import REPO, run_inproc, write_image_folder

BLOCK = re.compile(
    r"(?:<!-- not run: (?P<why>[^>]+?) -->\s*\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.S
)
PROGRAMS = ("python", "make", "experiments-", "sbatch", "srun", "scripts/", "mlflow", "wandb",
            "eval ", "source ", "bash ")  # fmt: skip
INLINE = re.compile(r"\(?not run here: ([^)]+)\)?\s*$")


@dataclass
class Command:
    doc: str
    line: str  # as written (continuations joined)
    not_run: str | None  # the reason, when marked
    expected: list[str]  # console transcripts: the output lines the docs show after it


def commands(doc: Path) -> list[Command]:
    found = []
    for block in BLOCK.finditer(doc.read_text()):
        if block.group("lang") in ("python", "yaml", "text", "toml"):
            continue
        lines = [ln.strip() for ln in block.group("body").replace("\\\n", " ").splitlines()]
        for i, line in enumerate(lines):
            command, _, comment = line.removeprefix("$ ").partition(" # ")
            if not command.startswith(PROGRAMS):
                continue
            inline = INLINE.search(comment)
            # a console transcript: the lines up to the next prompt are what it prints
            shown = itertools.takewhile(lambda out: not out.startswith("$ "), lines[i + 1 :])
            found.append(Command(
                doc.name, re.sub(r"\s+", " ", command).strip(),
                block.group("why") or (inline.group(1) if inline else None),
                list(shown) if line.startswith("$ ") else [],
            ))  # fmt: skip
    return found


def _doc_sandbox(tmp_path_factory, data_dir) -> tuple[Path, dict[str, str]]:
    """A folder with the data and runs the docs' commands name; the docs' placeholders -> them."""
    root = tmp_path_factory.mktemp("docs")
    write_image_folder(root / "my", n=24)
    write_image_folder(root, n=24)  # labels.csv + images/ (docs/data.md)
    write_image_folder(root / "imgs_src", n=8)[1].rename(root / "imgs")
    write_image_folder(root / "new_src", n=4)[1].rename(root / "new_images")
    names = sorted(p.name for p in (root / "imgs").iterdir())
    (root / "batch.csv").write_text("\n".join(["filename", *names]) + "\n")
    common = ["debug=limit", f"paths.data_dir={data_dir}", "logger=csv"]
    sweep = ["-m", "optimizer.lr=0.05,0.1", f"hydra.sweep.dir={root / 'thesweep'}"]
    for args in ([f"hydra.run.dir={root / 'therun'}"], sweep):
        res = run_inproc("-m", "experiments.train", *args, *common, cwd=root)
        assert res.returncode == 0, res.stderr[-2000:]
    return root, {
        "outputs/train/runs/<time>": str(root / "therun"),
        "outputs/train/runs/<run>": str(root / "therun"),
        "outputs/train/multiruns/<sweep>": str(root / "thesweep"),
        "<run>": str(root / "therun"),
    }


def check(command: Command, root: Path, data_dir: Path, places: dict[str, str]) -> None:
    """Runs a documented command in ``root``: it succeeds, or a transcript prints what the docs
    show. Training gets ``debug=fast`` (unless it names a ``debug=``), at most 2 Optuna trials,
    and the session's data folder."""
    line = command.line
    for placeholder, path in places.items():
        line = line.replace(placeholder, path)
    args = shlex.split(line)
    assert args[:2] == ["python", "-m"], f"{command.doc}: run only python -m commands: {line}"
    if args[2] == "experiments.train" and not any(a in ("--help", "-h") for a in args):
        if not any(a.startswith("debug=") for a in args):
            args.append("debug=fast")
        if "hparams_search=optuna" in args:
            args = [a for a in args if not a.startswith("hydra.sweeper.n_trials=")]
            args.append("hydra.sweeper.n_trials=2")
        args.append(f"paths.data_dir={data_dir}")
    env = {"WANDB_MODE": "offline", "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}
    res = run_inproc(*args[1:], cwd=root, env_extra=env)
    out = res.stdout + res.stderr
    if command.expected:  # a transcript: what the docs show is what it prints
        for shown in command.expected:
            if shown and not shown.startswith("..."):
                assert shown in out, f"{command.doc}: `{command.line}` printed:\n{out[-2000:]}"
        return
    assert res.returncode == 0, f"{command.doc}: `{shlex.join(args)}` failed:\n{out[-3000:]}"


DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FIRST = ("README.md", "index.md", "getting-started.md")


def _runnable(names: set[str]) -> list[Command]:
    """The runnable commands of the docs ``names``; one written the same way in several docs
    (a transcript: with the same output) runs once, where first written (README first)."""
    seen, mine = set(), []
    for doc in sorted(DOCS, key=lambda d: d.name not in FIRST):
        for command in commands(doc):
            key = (command.line, tuple(command.expected))
            if command.not_run is None and key not in seen:
                seen.add(key)
                if doc.name in names:
                    mine.append(command)
    return mine


def make_doc_tests(first: bool):
    """The two tests of one half of the docs (README + getting started, or the guides): two
    files that pytest-xdist runs side by side."""
    mine = [d for d in DOCS if (d.name in FIRST) is first]
    found = [c for doc in mine for c in commands(doc)]
    runnable = _runnable({d.name for d in mine})

    def test_every_command_runs_or_says_why_not():
        assert mine and len(found) >= 15
        assert all(c.not_run.strip() for c in found if c.not_run is not None)

    @pytest.mark.slow
    @pytest.mark.parametrize("command", runnable, ids=[f"{c.doc}:{c.line[:60]}" for c in runnable])
    def test_documented_command(command, doc_sandbox, data_dir):
        root, places = doc_sandbox
        check(command, root, data_dir, places)

    return test_every_command_runs_or_says_why_not, test_documented_command
