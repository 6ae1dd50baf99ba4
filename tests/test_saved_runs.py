"""Run dirs written by earlier versions still evaluate, predict, resume and compare.

``tests/data/run_2026_12_04_{mlp,cnn}`` were written by main as of 2026-12-04 (commit
c55242e): a 2-epoch MLP, and a 2-epoch CNN with EMA weights, auto-normalization
(``data_stats.json``) and shift augmentation. Each keeps its full checkpoint, so resume is
tested too. ``run_before_layout_move`` (older still) is tested in test_architecture.
"""

from __future__ import annotations

import csv
import json
import shutil

import pytest
import torch

from tests.helpers import REPO, run_inproc

FIXTURES = ("run_2026_12_04_mlp", "run_2026_12_04_cnn")


def _copy(name: str, tmp_path):
    run = tmp_path / name
    shutil.copytree(REPO / "tests" / "data" / name, run)
    return run


@pytest.mark.slow
@pytest.mark.parametrize("name", FIXTURES)
def test_an_earlier_run_dir_evaluates_predicts_and_resumes(tmp_path, data_dir, name):
    run = _copy(name, tmp_path)
    data = f"paths.data_dir={data_dir}"
    res = run_inproc("-m", "experiments.eval", f"run_dir={run}", data, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    then = json.loads((run / "metrics.json").read_text())["test/acc"]
    assert json.loads((run / "eval_metrics.json").read_text())["test/acc"] == then

    images = sorted((data_dir / "digits" / "images").glob("*.png"))[:5]
    folder = tmp_path / "some"
    folder.mkdir()
    for image in images:
        shutil.copy(image, folder)
    out = tmp_path / "pred.csv"
    res = run_inproc(
        "-m", "experiments.predict", f"run_dir={run}", f"input={folder}", f"output={out}",
        data, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    rows = list(csv.DictReader(out.open()))
    assert [r["file"] for r in rows] == [p.name for p in images]
    # written before manifests: a note, and no manifest is made up for files nobody checked
    res = run_inproc("-m", "experiments.verify", str(run), "integrity=true", cwd=tmp_path)
    assert res.returncode == 0 and "no manifest.json" in res.stdout
    assert not (run / "manifest.json").exists()

    before = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["epoch"]
    res = run_inproc(
        "-m", "experiments.train", f"resume={run}", "trainer.max_epochs=3", data,
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    after = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["epoch"]
    assert (before, after) == (1, 2)  # Lightning's 0-based epochs: 2 were done, then the 3rd
    assert json.loads((run / "checkpoints" / "last.json").read_text())["epoch"] == 3
    # the resumed run writes safetensors from then on: its last.pt is replaced, not kept
    names = {p.name for p in (run / "checkpoints").iterdir()}
    assert "last.safetensors" in names and "last.pt" not in names
    assert len(names & {"best.safetensors", "best.pt"}) == 1  # one best, whichever format
    res = run_inproc("-m", "experiments.verify", str(run), "integrity=true", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.startswith(f"intact: {run} (")


def test_earlier_run_dirs_compare(tmp_path):
    runs = [_copy(name, tmp_path) for name in FIXTURES]
    res = run_inproc("-m", "experiments.compare", *map(str, runs), "out=cmp", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    table = (tmp_path / "cmp" / "compare.md").read_text()
    for run in runs:
        acc = json.loads((run / "metrics.json").read_text())["test/acc"]
        assert f"{acc:.4f}" in table
