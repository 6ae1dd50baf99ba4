"""The lab notebook (issue 37): find_runs as a DataFrame, the where language, the index cache,
broken and running folders, tags and notes in the run folder, experiments-runs, and the HTML
report, opened in a real headless Chromium where one is installed."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

import experiments
from experiments.analysis.notebook import index as nb_index
from experiments.analysis.notebook.annotate import notes_file, read_tags
from experiments.analysis.notebook.report import page_data, write_report
from experiments.analysis.significance import metric_bounds, summarize
from experiments.errors import UserError
from experiments.runs.layout import RunDir, SweepDir
from experiments.runs.lock import RunLock
from tests.helpers import REPO, run_inproc, run_process

CMD = "experiments.cli.lab_notebook"  # the experiments-runs console script


# Synthetic run folders in the real format, many at once and with no training: for these tests
# and the notebook's benchmark (benchmarks/notebook.py).
LRS = (0.01, 0.03, 0.1, 0.3)
START = 1_790_000_000.0  # the first run's start time (2026-09); each next one a minute later


def _saved_config(data: str, model: str, lr: float, seed: int, tags: list[str]) -> dict:
    """A saved ``.hydra/config.yaml`` as Hydra writes it (unresolved interpolations), of the
    size and shape of a real one."""
    return {
        "task_name": "train", "seed": seed, "optimized_metric": "val/acc",
        "optimized_mode": "max", "tags": tags, "resume": None, "test": True,
        "cv": {"folds": None},
        "model": {
            "_target_": "experiments.models.ClassificationModule", "loss": "auto",
            "label_smoothing": 0.0, "monitor": "${optimized_metric}", "ema_decay": None,
            "net": {"_target_": f"experiments.models.{model.upper()}",
                    "hidden_sizes": [128, 64], "dropout": 0.0},
        },
        "optimizer": {"_target_": "torch.optim.SGD", "_partial_": True, "lr": lr,
                      "momentum": 0.9, "weight_decay": 0.0, "nesterov": False},
        "scheduler": None,
        "data": {"_target_": "experiments.data.ImageDataModule", "dataset": data,
                 "root": "${paths.data_dir}/" + data, "batch_size": 64, "num_workers": 0,
                 "val_fraction": 0.15, "split_seed": 0,
                 "stats_file": "${paths.output_dir}/data_stats.json"},
        "trainer": {"_target_": "lightning.pytorch.Trainer", "accelerator": "cpu",
                    "devices": 1, "max_epochs": 10, "precision": "32-true",
                    "gradient_clip_val": None, "deterministic": False},
        "callbacks": {"model_checkpoint": {"monitor": "${optimized_metric}", "save_top_k": 1},
                      "early_stopping": {"enabled": False, "patience": 5}},
        "logger": {"csv": {"_target_": "experiments.tracking.csv.CSVLogger", "name": ""}},
        "paths": {"root_dir": "${oc.env:EXPERIMENTS_ROOT,.}",
                  "data_dir": "${paths.root_dir}/data",
                  "output_dir": "${hydra:runtime.output_dir}"},
    }  # fmt: skip


def _accuracy(data: str, model: str, lr: float, seed: int, epoch: int) -> float:
    """A made-up but deterministic learning curve: better with the right lr, cnn, digits."""
    base = 0.9 if data == "digits" else 0.8
    base += 0.04 * (model == "cnn") - 0.1 * abs(LRS.index(lr) - 2) / 2
    noise = random.Random(f"{data}{model}{lr}{seed}").uniform(-0.02, 0.02)
    return round(min(0.999, base + noise - 0.3 / (epoch + 1)), 6)


def write_run(
    path: Path, data: str, model: str, lr: float, seed: int, *, tags=(), epochs: int = 6,
    start: float = START, job: bool = False,
) -> Path:  # fmt: skip
    """One finished run folder: config, overrides, Hydra's choices, metrics.json, best.json
    and the CSV logger's rows, with every file's mtime set to ``start`` (the run's start)."""
    run = RunDir(path)
    run.saved_config.parent.mkdir(parents=True, exist_ok=True)
    run.saved_config.write_text(yaml.safe_dump(_saved_config(data, model, lr, seed, list(tags)),
                                               sort_keys=False))  # fmt: skip
    overrides = [f"data={data}", f"model={model}", f"optimizer.lr={lr}", f"seed={seed}"]
    run.saved_overrides.write_text(yaml.safe_dump(overrides))
    choices = {"experiment": None, "hydra": "default", "paths": "default", "logger": "csv",
               "trainer": "default", "data": data, "scheduler": "none", "optimizer": "sgd",
               "model": model, "hydra/launcher": "basic"}  # fmt: skip
    hydra = {"hydra": {"run": {"dir": str(path)}, "runtime": {"output_dir": str(path),
                                                             "choices": choices}}}  # fmt: skip
    run.hydra_runtime.write_text(yaml.safe_dump(hydra, sort_keys=False))
    curve = [_accuracy(data, model, lr, seed, e) for e in range(epochs)]
    best = max(range(epochs), key=lambda e: curve[e])
    losses = [round(1.5 - c, 6) for c in curve]
    metrics = {
        "val/acc": curve[-1], "val/loss": losses[-1], "val/acc_best": curve[best],
        "test/acc": round(curve[best] - 0.01, 6), "test/loss": losses[best] + 0.01,
        "test/recall/0": 0.5, "epochs": epochs, "best_epoch": best + 1, "seed": seed,
        "wall_time_s": 10.0 + seed, "run_dir": str(path),
    }  # fmt: skip
    run.metrics.write_text(json.dumps(metrics, indent=2))
    run.checkpoints.mkdir(exist_ok=True)
    val = {"val/acc": curve[best], "val/loss": losses[best], "val/acc_best": curve[best]}
    sidecar = {"epoch": best + 1, "epoch_base": 1, "global_step": 10 * (best + 1),
               "monitor": "val/acc", "value": curve[best], "metrics": val}  # fmt: skip
    run.best_json.write_text(json.dumps(sidecar))
    run.csv_metrics.parent.mkdir(exist_ok=True)
    lines = ["epoch,step,train/loss,val/acc,val/loss"]
    for e in range(epochs):
        lines.append(f"{e},{10 * e + 9},{losses[e] + 0.05},,")
        lines.append(f"{e},{10 * e + 9},,{curve[e]},{losses[e]}")
    run.csv_metrics.write_text("\n".join(lines) + "\n")
    if job:
        record = {"status": "ok", "overrides": overrides, "value": curve[best], "num": 0}
        SweepDir.job_file(path).write_text(json.dumps(record))
    for f in path.rglob("*"):
        os.utime(f, (start, start))
    return path


def write_runs(root: Path, n: int, jobs_per_sweep: int = 20, tag_every: int = 3) -> list[Path]:
    """``n`` finished runs under ``root``: sweeps of ``jobs_per_sweep`` jobs (``sweep_<k>/<j>``,
    each sweep one data set and model over lrs x seeds, with ``sweep.json``), newest last.
    Every ``tag_every``-th run was launched with ``tags=[baseline]``."""
    paths = []
    for i in range(n):
        s, j = divmod(i, jobs_per_sweep)
        data, model = ("digits", "fashion_mnist")[s % 2], ("mlp", "cnn")[(s // 2) % 2]
        lr, seed = LRS[j % len(LRS)], (j // len(LRS)) % 5
        sweep = root / f"sweep_{s:03d}"
        if j == 0:
            sweep.mkdir(parents=True, exist_ok=True)
            SweepDir(sweep).sweep_file.write_text(json.dumps({"space": ["optimizer.lr", "seed"]}))
        tags = ["baseline"] if i % tag_every == 0 else []
        paths.append(write_run(sweep / str(j), data, model, lr, seed, tags=tags,
                               start=START + 60 * i, job=True))  # fmt: skip
    return paths


def runs_cmd(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_inproc("-m", CMD, *args, cwd=cwd)


@pytest.fixture
def outputs(tmp_path) -> Path:
    root = tmp_path / "outputs"
    write_runs(root, 24, jobs_per_sweep=8)
    return root


def reference(root: Path) -> pd.DataFrame:
    """The table computed the plain way: every run's files read with json/yaml and pandas."""
    rows = []
    for config_file in sorted(root.glob("*/*/.hydra/config.yaml")):
        run = RunDir(config_file.parent.parent)
        config = yaml.safe_load(config_file.read_text())
        metrics = json.loads(run.metrics.read_text())
        best = json.loads(run.best_json.read_text())
        rows.append({
            "name": run.path.relative_to(root).as_posix(), "data": config["data"]["dataset"],
            "lr": config["optimizer"]["lr"], "tags": config["tags"],
            "val/acc": best["metrics"]["val/acc"], "test/acc": metrics["test/acc"],
            "start": os.stat(run.saved_overrides).st_mtime,
        })  # fmt: skip
    return pd.DataFrame(rows)


def test_find_runs_equals_a_pandas_reference(outputs):
    ref = reference(outputs)
    want = ref[(ref["data"] == "fashion_mnist") & (ref["val/acc"] >= 0.68)
               & ref["tags"].map(lambda t: "baseline" in t)]  # fmt: skip
    want = want.sort_values("start", ascending=False)
    got = experiments.find_runs(
        outputs, where="data=fashion_mnist and val/acc>=0.68 and tag:baseline"
    )
    assert isinstance(got, pd.DataFrame) and len(want) >= 2
    assert list(got["name"]) == list(want["name"])  # the same runs, newest first
    assert list(got["val/acc"]) == list(want["val/acc"])  # the selected epoch's, not the last
    assert list(got["test/acc"]) == list(want["test/acc"])
    everything = experiments.find_runs(outputs)
    assert len(everything) == len(ref) == 24
    assert {"overrides", "status", "tags", "note", "start", "duration_s", "path",
            "optimizer.lr", "model", "val/acc"} <= set(everything.columns)  # fmt: skip
    assert set(everything["kind"]) == {"job"} and set(everything["status"]) == {"finished"}
    by_lr = experiments.find_runs(outputs, where="(optimizer.lr<0.05 or model=cnn) and not seed=0")
    mask = ((ref["lr"] < 0.05) | ref["name"].str.startswith(("sweep_002", "sweep_003"))) & ~ref[
        "name"
    ].map(lambda n: int(n.split("/")[1]) < 4)
    assert sorted(by_lr["name"]) == sorted(ref[mask]["name"])


def test_the_report_groups_with_compares_statistics(outputs):
    from experiments.analysis.groups import compare

    data = page_data(outputs)
    comparison = compare([str(outputs)], "val/acc", "max")
    ours = {tuple(sorted(g["runs"])): g for g in data["groups"]["val/acc"]["config"]}
    assert len(ours) == len(comparison.groups) >= 4
    for group in comparison.groups:
        names = tuple(sorted(r.path.relative_to(outputs).as_posix() for r in group.runs))
        stats = group.stats["val/acc"]
        mine = ours[names]
        assert (mine["n"], mine["mean"]) == (stats.n, pytest.approx(stats.mean, rel=1e-5))
        assert (mine["low"], mine["high"]) == (
            pytest.approx(stats.ci_low, rel=1e-5),
            pytest.approx(stats.ci_high, rel=1e-5),
        )
    one = data["groups"]["val/acc"]["optimizer.lr"][0]
    values = [float(experiments.find_runs(outputs, where=f"name={n}")["val/acc"][0])
              for n in one["runs"]]  # fmt: skip
    assert one["mean"] == pytest.approx(summarize(values, metric_bounds("val/acc")).mean, rel=1e-5)


def test_the_cache_reads_again_only_what_changed(outputs):
    first = nb_index.build(outputs)
    assert first.read == 24 and (outputs / nb_index.INDEX_FILE).is_file()
    assert nb_index.build(outputs).read == 0  # warm: nothing opened
    run = RunDir(outputs / "sweep_001" / "3")
    metrics = json.loads(run.metrics.read_text())
    metrics["test/acc"] = 0.123
    run.metrics.write_text(json.dumps(metrics) + "\n")  # another size: changed
    again = nb_index.build(outputs)
    assert again.read == 1
    assert experiments.find_runs(outputs, where="name=sweep_001/3")["test/acc"][0] == 0.123
    (outputs / nb_index.INDEX_FILE).write_text('{"version": 1, "entries": {"x": ')  # corrupt
    assert nb_index.build(outputs).read == 24  # rebuilt, never an error
    cache = json.loads((outputs / nb_index.INDEX_FILE).read_text())
    cache["entries"]["sweep_000/0"]["record"]["metrics"] = {"val/acc": "<b>x</b>"}
    (outputs / nb_index.INDEX_FILE).write_text(json.dumps(cache))
    assert nb_index.build(outputs).read == 1  # an entry of the wrong shape is read again
    cache = json.loads((outputs / nb_index.INDEX_FILE).read_text())
    cache["entries"]["sweep_000/0"]["record"]["config_id"] = [1]  # unhashable
    (outputs / nb_index.INDEX_FILE).write_text(json.dumps(cache))
    assert nb_index.build(outputs).read == 1


def test_broken_folders_are_listed_with_their_reason(outputs, tmp_path):
    bad = outputs / "sweep_000"
    RunDir(bad / "0").metrics.write_text("{not json")
    RunDir(bad / "1").saved_config.unlink()
    RunDir(bad / "2").saved_config.write_text("a: [unclosed\n")
    RunDir(bad / "3").metrics.unlink()
    (bad / "4" / "notes.json").write_text("[1, 2]")
    df = experiments.find_runs(outputs, sort="name", ascending=True)
    by = df.set_index("name")
    assert len(df) == 24
    assert by.at["sweep_000/0", "status"] == "broken"
    assert "metrics.json: not valid JSON" in by.at["sweep_000/0", "reason"]
    assert by.at["sweep_000/1", "reason"] == "no .hydra/config.yaml"
    assert "not valid YAML" in by.at["sweep_000/2", "reason"]
    assert by.at["sweep_000/3", "status"] == "broken"
    assert "no metrics.json and no process training it" in by.at["sweep_000/3", "reason"]
    assert by.at["sweep_000/4", "status"] == "finished"  # a bad notes file: a reason, results stand
    assert "notes.json" in by.at["sweep_000/4", "reason"]
    res = runs_cmd("list", str(outputs), "limit=0", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "broken" in res.stdout and "24 runs (19 finished, 4 broken, 1" not in res.stdout
    assert re.search(r"24 runs \(20 finished, 4 broken\)", res.stdout), res.stdout[-500:]


def test_a_running_run_is_marked_and_read_safely(tmp_path):
    root = tmp_path / "outputs"
    path = write_run(root / "live", "digits", "mlp", 0.1, 0)
    run = RunDir(path)
    run.metrics.unlink()
    with open(run.csv_metrics, "a") as f:
        f.write("6,69,,0.5")  # a row still being written: no newline yet
    with RunLock(path):
        df = experiments.find_runs(root)
        assert df["status"][0] == "running" and "training: pid" in df["reason"][0]
        record = nb_index.build(root).records[0]
        assert max(e for e, _ in record["curves"]["val/acc"]) == 6  # the partial row left out
        assert nb_index.build(root).read == 1  # never cached: read afresh each time
    assert experiments.find_runs(root)["status"][0] == "broken"  # let go, no metrics: stopped


def test_bad_where_is_one_line_with_the_valid_keys(outputs, tmp_path):
    res = runs_cmd("list", str(outputs), "where=val/acx>=0.9", cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.startswith("error: where: unknown key 'val/acx'; did you mean val/acc")
    assert "valid keys: name, status" in res.stderr and res.stderr.count("\n") == 1
    bad = [("val/acc>=", "needs a value"), ("(seed=1", "'(' is not closed"),
           ("val/acc 0.9", "needs an operator"), ("data<x", "compares numbers")]  # fmt: skip
    for where, says in bad:
        with pytest.raises(UserError, match=re.escape(says)):
            experiments.find_runs(outputs, where=where)
    res = runs_cmd("list", str(outputs), "sort=val/acx", cwd=tmp_path)
    assert res.returncode == 2 and "did you mean val/acc" in res.stderr
    assert runs_cmd("lst", cwd=tmp_path).stderr.startswith("error: unknown command 'lst'; did you")


def test_tags_and_notes_live_in_the_run_folder(outputs, tmp_path):
    run = outputs / "sweep_000" / "0"  # launched with tags=[baseline]
    assert read_tags(run) == ["baseline"]
    res = runs_cmd("tag", str(run), "keep", "lr-check", cwd=tmp_path)
    assert res.returncode == 0 and "baseline, keep, lr-check" in res.stdout
    res = runs_cmd("tag", str(run), "remove=baseline", cwd=tmp_path)
    assert read_tags(run) == ["keep", "lr-check"]  # the saved config is left as it ran
    assert yaml.safe_load(RunDir(run).saved_config.read_text())["tags"] == ["baseline"]
    res = runs_cmd("note", str(run), "lr=0.01 is too low; see", "sweep_001", cwd=tmp_path)
    assert res.returncode == 0
    assert json.loads(notes_file(run).read_text())["note"] == "lr=0.01 is too low; see sweep_001"
    assert [p.name for p in run.iterdir() if p.name.endswith(".tmp")] == []  # atomic: no debris
    df = experiments.find_runs(outputs, where="tag:keep and note~'too low'")
    assert list(df["name"]) == ["sweep_000/0"]
    for target, says in [(outputs / "sweep_000", "not a run folder"),
                         (outputs / "nowhere", "no such folder"),
                         (RunDir(run).metrics, "a file, not a run folder")]:  # fmt: skip
        for args in (("tag", str(target), "x"), ("note", str(target), "text")):
            res = runs_cmd(*args, cwd=tmp_path)
            assert res.returncode == 2 and says in res.stderr and "Traceback" not in res.stderr
    assert not notes_file(outputs / "sweep_000").exists()
    res = runs_cmd("tag", str(run), "bad tag!", cwd=tmp_path)
    assert res.returncode == 2 and "letters, digits" in res.stderr


def test_show_and_diff(outputs, tmp_path):
    a, b = outputs / "sweep_000" / "0", outputs / "sweep_000" / "5"
    res = runs_cmd("show", str(a), cwd=tmp_path)
    assert res.returncode == 0
    assert "status          finished" in res.stdout and "data=digits" in res.stdout
    assert re.search(r"val/acc\s+0\.\d+", res.stdout)
    res = runs_cmd("diff", str(a), str(b), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "optimizer.lr  0.01 -> 0.03" in res.stdout and "seed          0 -> 1" in res.stdout
    assert "tags" not in res.stdout  # launch tags are no config difference
    res = runs_cmd("diff", str(a), cwd=tmp_path)
    assert res.returncode == 2 and "two run folders" in res.stderr


def test_report_is_self_contained_and_escapes_run_data(outputs, tmp_path):
    hostile = "</script><script>document.title='pwned'</script> & <b>bold</b>"
    runs_cmd("note", str(outputs / "sweep_000" / "1"), hostile, cwd=tmp_path)
    out, n, size = write_report(outputs, tmp_path / "runs.html")
    text = out.read_text()
    assert n == 24 and size == len(text.encode()) and size < 5e6
    assert "<script>document.title" not in text and "\\u003c/script\\u003e" in text
    assert re.search(r"""<meta http-equiv="Content-Security-Policy" content="default-src 'none';""",
                     text)  # fmt: skip
    # no attribute anywhere in the file points out of it (Plotly's bundle included)
    assert not re.findall(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", text, flags=re.I)


def test_import_experiments_stays_cheap():
    code = "import sys, experiments; print(sorted({'pandas','torch','plotly'} & set(sys.modules)))"
    res = run_process([sys.executable, "-c", code], check=True)
    assert res.stdout.strip() == "[]"
    assert experiments.find_runs.__module__ == "experiments.analysis.notebook.query"


def test_docs_example_runs(outputs, tmp_path, monkeypatch):
    doc = (REPO / "docs" / "analysis.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    assert blocks
    monkeypatch.chdir(tmp_path)  # the docs say "outputs"
    scope: dict = {}
    for block in blocks:
        exec(compile(block, "docs/analysis.md", "exec"), scope)  # noqa: S102 (our own docs)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--virtual-time-budget=5000", *args]  # fmt: skip
    return run_process(cmd, timeout=timeout)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (apt-get install chromium)")
def test_report_in_a_real_browser(outputs, tmp_path):
    note = "<script>document.title='pwned'</script>"
    runs_cmd("note", str(outputs / "sweep_001" / "2"), note, cwd=tmp_path)
    out, n, _ = write_report(outputs, tmp_path / "runs.html", title="notebook test")
    url = out.resolve().as_uri()
    res = chromium("--dump-dom", f"{url}#sort=val/acc&order=asc")
    dom = res.stdout
    assert 'data-ready="1"' in dom, res.stderr[-2000:]
    assert "data-plotly" not in dom  # the bundle unpacked and the plots drawn
    assert 'data-csp-violations="0"' in dom  # nothing was requested (or blocked)
    assert '<table id="runs" data-rows="24">' in dom
    tbody = dom[dom.index('<table id="runs"') :]
    tbody = tbody[tbody.index("<tbody>") : tbody.index("</tbody>")]
    rows = re.findall(r'<tr data-i="\d+".*?</tr>', tbody, re.S)
    assert len(rows) == n == 24
    head = dom[dom.index('<table id="runs"') :]
    head = re.findall(r'<th data-key="([^"]+)"', head[: head.index("</thead>")])
    at = head.index("val/acc") + 1  # the tick box comes first
    shown = [float(re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)[at]) for r in rows]
    assert shown == sorted(shown) and shown != sorted(shown, reverse=True)
    order = [int(i) for i in re.findall(r'<tr data-i="(\d+)"', tbody)]
    assert order != list(range(n))  # rows come newest first: the sort reordered them
    assert "<title>notebook test</title>" in dom  # the note's script did not run ...
    assert "&lt;script&gt;document.title='pwned'&lt;/script&gt;</td>" in dom  # ... it is text
    shot = tmp_path / "notebook.png"
    chromium("--window-size=1400,2600", f"--screenshot={shot}", url)
    assert shot.is_file() and shot.stat().st_size > 10_000
    if os.environ.get("EXPERIMENTS_UPDATE_SCREENSHOT"):  # refresh the docs' picture
        shutil.copy(shot, REPO / "docs" / "img" / "notebook.png")


@pytest.fixture(scope="module")
def real_sweep(tmp_path_factory, data_dir) -> Path:
    """A real sweep of two short jobs (debug=limit: checkpoints kept) launched with tags=[first]."""
    root = tmp_path_factory.mktemp("real")
    res = run_inproc(
        "-m", "experiments.train", "-m", "seed=0,1", "debug=limit", "tags=[first]",
        f"paths.data_dir={data_dir}", f"hydra.sweep.dir={root / 'outputs' / 'sweep'}", cwd=root,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    return root / "outputs"


@pytest.mark.slow
def test_real_sweep_jobs_are_found_and_read(real_sweep, tmp_path):
    single = write_run(real_sweep / "single", "digits", "mlp", 0.1, 42)  # + folds: cv.folds=2
    for k in range(2):
        write_run(RunDir(single).fold(k).path, "digits", "mlp", 0.1, 42)
    df = experiments.find_runs(real_sweep, sort="name", ascending=True)
    assert list(df["name"]) == ["single", "sweep/0", "sweep/1"]
    assert list(df["kind"]) == ["cv", "job", "job"] and set(df["status"]) == {"finished"}
    assert list(df["tags"]) == [[], ["first"], ["first"]]
    assert list(df["seed"]) == [42, 0, 1] and set(df["data"]) == {"digits"}
    assert len(df) == 3  # the folds are inside their run, not runs of their own
    for name in ("sweep/0", "single"):
        metrics = json.loads(RunDir(real_sweep / name).metrics.read_text())
        assert df.set_index("name").at[name, "test/acc"] == metrics["test/acc"]
    best = json.loads(RunDir(real_sweep / "sweep/0").best_json.read_text())
    assert df.set_index("name").at["sweep/0", "val/acc"] == best["metrics"]["val/acc"]
    assert single.is_dir()


@pytest.mark.slow
def test_a_tag_does_not_make_verify_call_the_run_modified(real_sweep, tmp_path):
    from experiments.runs.manifest import check_integrity

    run = real_sweep / "sweep" / "1"
    assert check_integrity(run).intact
    runs_cmd("tag", str(run), "checked", cwd=tmp_path)
    assert check_integrity(run).intact


@pytest.mark.slow
def test_compare_the_sweep_summary_and_the_model_card_show_tags(real_sweep, tmp_path):
    sweep = real_sweep / "sweep"
    summary = (sweep / "summary.md").read_text()
    header = next(line for line in summary.splitlines() if line.startswith("| job"))
    assert "tags" in [c.strip() for c in header.split("|")]
    assert sum(line.endswith("| first |") for line in summary.splitlines()) == 2
    card = RunDir(sweep / "0").model_card.read_text()
    assert "- tags: `first` (as of this card's writing)" in card
    runs_cmd("tag", str(sweep / "1"), "checked", cwd=tmp_path)
    res = run_inproc("-m", "experiments.compare", str(sweep), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    report = (sweep / "compare.md").read_text()
    assert "[tags: first, checked]" in report and "[tags: first]" in report


def test_a_metric_the_runs_minimize_sorts_lowest_first_whatever_its_name(tmp_path):
    # val/wer names no lower-is-better word: the runs' optimized_mode says it
    for seed, wer in ((0, 0.3), (1, 0.1), (2, 0.2)):
        run = RunDir(write_run(tmp_path / f"r{seed}", "digits", "mlp", 0.1, seed))
        cfg = yaml.safe_load(run.saved_config.read_text())
        cfg.update(optimized_metric="val/wer", optimized_mode="min")
        run.saved_config.write_text(yaml.safe_dump(cfg, sort_keys=False))
        run.metrics.write_text(json.dumps({**json.loads(run.metrics.read_text()), "val/wer": wer}))
    df = experiments.find_runs(tmp_path, sort="val/wer")
    assert list(df["val/wer"]) == [0.1, 0.2, 0.3]
    assert page_data(tmp_path)["lower"][:1] == ["val/wer"]  # the page's "best 10" too
