"""``experiments.compare``: runs grouped by config (seed and per-run locations left out),
mean ± std and the t confidence interval per group, skipped runs listed, one-line errors.

The slow tests compare a real 2 x 3 sweep made by the train CLI; the others use small
synthetic run folders."""

from __future__ import annotations

import csv
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from experiments.analysis.comparison_report import markdown, read_curve
from experiments.analysis.groups import compare
from experiments.analysis.readings import group_config
from experiments.analysis.significance import summarize, t_quantile_975
from experiments.compare import main
from experiments.errors import UserError
from tests.helpers import (
    assert_one_line_error,
    run_inproc,
    run_process,
    saved_config,
    table_header,
    table_rows,
    write_run,
)


def lr_runs(root: Path, accs: dict[float, list[float]]) -> list[Path]:
    runs = []
    for lr, values in accs.items():
        for seed, acc in enumerate(values):
            metrics = {"test/acc": acc, "val/acc": acc - 0.01, "seed": seed, "wall_time_s": 1.0}
            run = root / f"lr{lr}-s{seed}"
            runs.append(write_run(run, saved_config(lr, seed), metrics, curve=[acc - 0.2, acc]))
    return runs


# ---------------------------------------------------------------- grouping rule


def test_group_config_leaves_out_seed_and_per_run_locations():
    cfg = saved_config(
        0.05,
        seed=7,
        hydra={"run": {"dir": "x"}},
        model__export_to="/runs/1/model.onnx",  # saved resolved: the run's own folder
        model__init_from="/runs/10/best.pt",  # another run's folder: a real choice
        logger__wandb={"name": "${paths.job_name}", "project": "p"},
    )
    flat = group_config(cfg, run_dirs=["/runs/1"])
    assert flat == {
        "optimized_metric": "val/acc",
        "data.batch_size": 64,
        "model.monitor": "${optimized_metric}",  # compared as written
        "model.net.channels": [16, 32],  # a list is one value
        "model.init_from": "/runs/10/best.pt",
        "optimizer._target_": "torch.optim.SGD",
        "optimizer.lr": 0.05,
        "trainer.max_epochs": 2,
        "logger.csv.name": "csv",
        "logger.wandb.project": "p",
    }
    assert "data.batch_size" not in group_config(cfg, ignore=["data"])
    assert "model.net.channels" not in group_config(cfg, ignore=["model.net.channels"])


def test_runs_group_by_config_not_by_seed_or_folder(tmp_path):
    # configs saved resolved: every location differs per run, and must not split groups
    for lr in (0.1, 0.2):
        for seed in range(3):
            run = tmp_path / "runs" / f"{lr}_{seed}"
            cfg = saved_config(lr, seed)
            cfg["data"]["stats_file"] = f"{run}/data_stats.json"
            cfg["trainer"]["default_root_dir"] = str(run)
            cfg["model"]["onnx_file"] = f"{run}/model.onnx"
            cfg["task_name"] = f"job{seed}"
            write_run(run, cfg, {"test/acc": lr + seed / 100, "seed": seed})
    # a key only one run has: a group of its own, the key absent for the others
    odd = saved_config(0.1, 0, trainer__deterministic=True)
    write_run(tmp_path / "runs" / "odd", odd, {"test/acc": 0.05})
    result = compare([str(tmp_path / "runs")], metric="test/acc")
    assert [len(g.runs) for g in result.groups] == [3, 3, 1]
    assert result.keys == ["optimizer.lr", "trainer.deterministic"]
    assert [g.config["optimizer.lr"] for g in result.groups] == [0.2, 0.1, 0.1]
    md = markdown(result)
    assert [r[1:3] for r in table_rows(md)] == [
        ["0.2", "(absent)"],
        ["0.1", "(absent)"],
        ["0.1", "true"],
    ]


# ---------------------------------------------------------------- statistics


def test_t_quantile_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in [*range(1, 61), 100, 1000, 10**6]:
        assert t_quantile_975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-6)
    with pytest.raises(ValueError):
        t_quantile_975(0)


def test_summary_matches_numpy_and_scipy():
    values = [0.91, 0.87, 0.93, 0.88, 0.9]
    s = summarize(values)
    assert s.n == 5
    assert s.mean == pytest.approx(np.mean(values), abs=1e-15)
    assert s.std == pytest.approx(np.std(values, ddof=1), rel=1e-12)
    half = t_quantile_975(4) * np.std(values, ddof=1) / math.sqrt(5)
    assert (s.ci_low, s.ci_high) == pytest.approx((s.mean - half, s.mean + half))
    stats = pytest.importorskip("scipy.stats")
    low, high = stats.t.interval(0.95, 4, loc=np.mean(values), scale=stats.sem(values))
    assert (s.ci_low, s.ci_high) == pytest.approx((low, high), abs=1e-6)
    one = summarize([0.5])
    assert (one.n, one.mean, one.std, one.ci_low, one.ci_high) == (1, 0.5, None, None, None)


def test_the_report_goes_next_to_its_inputs_not_into_the_current_folder(tmp_path, monkeypatch):
    lr_runs(tmp_path / "a" / "sweep", {0.01: [0.80, 0.82], 0.05: [0.90, 0.92]})
    lr_runs(tmp_path / "a" / "other", {0.1: [0.5, 0.6]})
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    main([str(tmp_path / "a" / "sweep")])
    assert (tmp_path / "a" / "sweep" / "compare.md").is_file()
    main([str(tmp_path / "a" / "sweep"), str(tmp_path / "a" / "other")])
    assert (tmp_path / "a" / "compare" / "compare.md").is_file()
    main([str(tmp_path / "a" / "sweep"), f"--out={tmp_path / 'mine'}"])
    assert (tmp_path / "mine" / "compare.csv").is_file()
    assert list((tmp_path / "cwd").iterdir()) == []


def test_table_marks_best_by_mode_and_single_run_groups(tmp_path, monkeypatch, capsys):
    lr_runs(tmp_path / "sweep", {0.01: [0.80, 0.82, 0.81], 0.05: [0.90, 0.92], 0.1: [0.5]})
    monkeypatch.chdir(tmp_path)
    main([str(tmp_path / "sweep"), "out=cmp"])
    out = capsys.readouterr().out
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert out.startswith(md.split("## Runs")[0].rstrip())  # the table is printed
    rows = table_rows(md)
    assert [r[0] for r in rows] == ["g1 (best)", "g2", "g3"]
    assert [(r[1], r[2]) for r in rows] == [("0.05", "2"), ("0.01", "3"), ("0.1", "1")]
    assert rows[2][3:6] == ["0.4900 (last)", "—", "last"]  # n=1: a mean, no std, no CI
    assert "g3: one run only" in md
    assert table_header(md)[:7] == [  # the runs' optimized metric (val/acc) ranks; test beside it
        "group",
        "optimizer.lr",
        "n",
        "val/acc mean ± std",
        "val/acc 95% CI",
        "epoch",
        "test/acc mean ± std",
    ]
    columns = table_header(md)
    assert "wall_time_s mean ± std" in columns and "test/macro_f1 mean ± std" not in columns
    with open(tmp_path / "cmp" / "compare.csv") as f:
        table = list(csv.DictReader(f))
    assert [(r["group"], r["verdict"], r["n"], r["seeds"]) for r in table] == [
        ("g1", "best", "2", "0 1"),
        ("g2", "", "3", "0 1 2"),
        ("g3", "", "1", "0"),
    ]
    assert float(table[1]["test/acc mean"]) == pytest.approx(0.81)
    assert float(table[1]["val/acc mean"]) == pytest.approx(0.80)
    assert table[2]["val/acc std"] == "" and table[2]["val/acc epochs"] == "last"
    assert (tmp_path / "cmp" / "compare.png").read_bytes()[:4] == b"\x89PNG"

    main([str(tmp_path / "sweep"), "mode=min", "metric=val/acc", "out=cmp"])
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert md.startswith("# Compare: val/acc (lower is better)")
    assert table_rows(md)[0][:2] == ["g1 (best)", "0.1"]


def test_read_curve_takes_the_val_rows_of_lightnings_csv(tmp_path):
    run = write_run(tmp_path / "r", saved_config(), {"test/acc": 0.9}, curve=[0.5, 0.7, 0.8])
    assert read_curve(run) == {0: 0.5, 1: 0.7, 2: 0.8}
    assert read_curve(run, "val/nope") == {}
    assert read_curve(tmp_path / "missing") == {}


# ---------------------------------------------------------------- finding and skipping


def test_globs_files_and_overlapping_paths_count_each_run_once(tmp_path):
    runs = lr_runs(tmp_path / "sweep", {0.01: [0.8, 0.81], 0.05: [0.9, 0.91]})
    (tmp_path / "sweep" / "summary.csv").write_text("job\n")  # a file a shell glob picks up
    result = compare(
        [
            str(tmp_path / "sweep"),
            str(tmp_path / "sweep" / "*"),
            str(runs[0]),
            str(runs[1] / "metrics.json"),
            str(tmp_path / "**" / "lr0.05-s1"),
        ]
    )
    assert sorted(len(g.runs) for g in result.groups) == [2, 2]
    assert not result.skipped


def test_unreadable_runs_are_skipped_and_listed(tmp_path, monkeypatch, capsys):
    root = tmp_path / "sweep"
    runs = lr_runs(root, {0.01: [0.8, 0.81, 0.82], 0.05: [0.9, 0.91, 0.92]})
    text = runs[0].joinpath("metrics.json").read_text()
    runs[0].joinpath("metrics.json").write_text(text[: len(text) // 2])  # torn mid-write
    runs[1].joinpath("metrics.json").write_text(json.dumps({"val/acc": 0.8}))
    runs[2].joinpath(".hydra", "config.yaml").write_text("data: [unclosed\n  x: {")
    runs[3].joinpath("metrics.json").write_text('{"test/acc": NaN}')
    unfinished = root / "unfinished"
    (unfinished / ".hydra").mkdir(parents=True)
    (unfinished / ".hydra" / "config.yaml").write_text(yaml.safe_dump(saved_config()))
    failed = root / "failed"
    shutil.copytree(unfinished, failed)
    (failed / "job.json").write_text(json.dumps({"status": "failed", "error": "OSError: disk"}))
    monkeypatch.chdir(tmp_path)
    main(["sweep", "out=cmp", "metric=test/acc"])
    out = capsys.readouterr().out
    md = (tmp_path / "cmp" / "compare.md").read_text()
    for text in (out, md):
        assert "skipped 6 runs:" in text
        assert "sweep/lr0.01-s0: metrics.json: not valid JSON (Unterminated string" in text
        assert "sweep/lr0.01-s1: metrics.json has no test/acc" in text
        assert "sweep/lr0.01-s2: .hydra/config.yaml: not valid YAML" in text
        assert "sweep/lr0.05-s0: test/acc is nan in metrics.json, not a finite number" in text
        assert "sweep/unfinished: no metrics.json (unfinished or failed run)" in text
        assert "sweep/failed: no metrics.json: the job failed (OSError: disk)" in text
    assert [r[:2] for r in table_rows(md)] == [["g1", "2"]]  # one group: nothing to beat
    assert "all runs share one config" in md


def test_nothing_to_compare_exits_2_in_one_line(tmp_path):
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    res = run_inproc("-m", "experiments.compare", str(empty), "out=cmp", cwd=tmp_path)
    assert_one_line_error(res, "no runs found under", str(empty))
    assert not (tmp_path / "cmp").exists()

    torn = write_run(tmp_path / "torn" / "0", saved_config(), {"test/acc": 0.9})
    torn.joinpath("metrics.json").write_text('{"test/ac')
    res = run_inproc("-m", "experiments.compare", str(tmp_path / "torn"), cwd=tmp_path)
    assert_one_line_error(
        res, "no run to compare under", "skipped 1 run:", "metrics.json: not valid JSON"
    )

    with pytest.raises(UserError, match=r"no such file or folder: .*nope.*metrc=x: not an option"):
        compare([str(torn), str(tmp_path / "nope"), "metrc=x"])
    with pytest.raises(UserError, match="mode=best: must be max or min"):
        compare([str(torn)], mode="best")
    with pytest.raises(UserError, match="at least one run folder"):
        compare([])


def test_help_and_imports_stay_light(tmp_path):
    res = run_inproc("-m", "experiments.compare", "--help", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: python -m experiments.compare")
    heavy = "{'torch', 'lightning', 'matplotlib', 'scipy'}"
    code = f"import experiments.compare, sys; print(sorted({heavy} & set(sys.modules)))"
    res = run_process([sys.executable, "-c", code])
    assert res.stdout.strip() == "[]", res.stderr


# ---------------------------------------------------------------- a real sweep


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, data_dir) -> Path:
    """2 learning rates x 3 seeds, 2 epochs of digits, by the train CLI as one -m sweep."""
    cwd = tmp_path_factory.mktemp("compare_sweep")
    res = run_inproc(
        "-m",
        "experiments.train",
        "-m",
        "optimizer.lr=0.01,0.05",
        "seed=0,1,2",
        "trainer.max_epochs=2",
        "logger=csv",
        "data.num_workers=0",
        f"paths.data_dir={data_dir}",
        cwd=cwd,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (path,) = (cwd / "outputs" / "train" / "multiruns").iterdir()
    return path


def sweep_metrics(sweep: Path) -> dict[float, list[dict]]:
    """metrics.json of each job by lr, with its best.json as ``"best"``."""
    by_lr: dict[float, list[dict]] = {}
    for job in sorted(p for p in sweep.iterdir() if p.is_dir()):
        cfg = yaml.safe_load((job / ".hydra" / "config.yaml").read_text())
        metrics = json.loads((job / "metrics.json").read_text())
        metrics["best"] = json.loads((job / "checkpoints" / "best.json").read_text())
        by_lr.setdefault(cfg["optimizer"]["lr"], []).append(metrics)
    return by_lr


@pytest.mark.slow
def test_real_sweep_two_groups_with_numpy_stats(sweep, tmp_path):
    res = run_inproc("-m", "experiments.compare", str(sweep), "out=cmp", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "6 runs in 2 groups" in res.stdout
    assert "groups differ in: `optimizer.lr`." in md
    assert table_header(md)[1:3] == ["optimizer.lr", "n"]  # the only differing key
    by_lr = sweep_metrics(sweep)
    rows = table_rows(md)
    assert len(rows) == 2 and {r[2] for r in rows} == {"3"}
    # ranked by the runs' optimized metric (val/acc) at the selected epoch: best.json's
    selected = {lr: np.mean([m["best"]["value"] for m in runs]) for lr, runs in by_lr.items()}
    assert rows[0][1] == str(max(selected, key=selected.get))
    assert rows[0][0] in ("g1 (best)", "g1 (tie)")
    columns = table_header(md)
    for row in rows:
        runs = by_lr[float(row[1])]
        for metric in ("val/acc", "test/acc", "wall_time_s"):
            values = [m["best"]["value"] if metric == "val/acc" else m[metric] for m in runs]
            cell = row[columns.index(f"{metric} mean ± std")]
            assert cell == f"{np.mean(values):.4f} ± {np.std(values, ddof=1):.4f}"
        epochs = [m["best"]["epoch"] for m in runs]
        assert row[columns.index("epoch")] == "best " + ", ".join(map(str, epochs))
    with open(tmp_path / "cmp" / "compare.csv") as f:
        table = {float(r["optimizer.lr"]): r for r in csv.DictReader(f)}
    for lr, runs in by_lr.items():
        values = [m["test/acc"] for m in runs]
        assert float(table[lr]["test/acc mean"]) == pytest.approx(np.mean(values), abs=1e-12)
        assert float(table[lr]["test/acc std"]) == pytest.approx(np.std(values, ddof=1))
        assert table[lr]["seeds"] == "0 1 2"
    assert (tmp_path / "cmp" / "compare.png").read_bytes()[:4] == b"\x89PNG"
    assert "val/acc curves of 6 of 6 runs" in res.stdout


@pytest.mark.slow
def test_real_sweep_mixed_with_single_run_folders(sweep, tmp_path, monkeypatch, capsys):
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    elsewhere = tmp_path / "outputs" / "train" / "runs" / "2025-01-01_00-00-00"
    shutil.copytree(jobs[0], elsewhere)  # the same run copied: a run of its own, same seed
    monkeypatch.chdir(tmp_path)
    main([str(jobs[1]), str(sweep), f"{sweep}/[0-9]", str(elsewhere), "out=cmp"])
    md = (tmp_path / "cmp" / "compare.md").read_text()
    rows = table_rows(md)
    assert sorted(r[2] for r in rows) == ["3", "4"]  # 6 sweep jobs once each + the copy
    lr0 = yaml.safe_load((jobs[0] / ".hydra" / "config.yaml").read_text())["optimizer"]["lr"]
    assert next(r for r in rows if r[2] == "4")[1] == str(lr0)
    assert "has runs with the same seed" in md
    assert "skipped" not in capsys.readouterr().out


@pytest.mark.slow
def test_real_sweep_torn_metrics_is_skipped(sweep, tmp_path, monkeypatch, capsys):
    copy = Path(shutil.copytree(sweep, tmp_path / "sweep"))
    metrics = copy / "0" / "metrics.json"
    metrics.write_text(metrics.read_text()[:40])
    monkeypatch.chdir(tmp_path)
    main(["sweep", "out=cmp"])
    out = capsys.readouterr().out
    assert "skipped 1 run:\n- sweep/0: metrics.json: not valid JSON (" in out
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "- sweep/0: metrics.json: not valid JSON" in md
    assert sorted(r[2] for r in table_rows(md)) == ["2", "3"]


def test_welchs_t_and_the_verdict_match_scipy():
    from experiments.analysis.verdict import decide, welch

    stats = pytest.importorskip("scipy.stats")
    cases = [
        ([0.91, 0.92, 0.93], [0.80, 0.81, 0.79]),  # clearly better
        ([0.91, 0.87, 0.93], [0.90, 0.86, 0.92]),  # seed noise
        ([0.95, 0.96, 0.94, 0.95], [0.93, 0.97, 0.91]),  # unequal n and spread
    ]
    for a, b in cases:
        t, df = welch(summarize(a), summarize(b))
        ref = stats.ttest_ind(a, b, equal_var=False)
        assert t == pytest.approx(ref.statistic, rel=1e-9)
        assert df == pytest.approx(ref.df, rel=1e-9)
        v = decide(["g1", "g2"], [a, b], [[("s", i) for i in range(len(a))],
                   [("s", 10 + i) for i in range(len(b))]], "max")  # fmt: skip
        assert v.pairs[0].test == "Welch's t"
        assert v.pairs[0].p == pytest.approx(ref.pvalue, rel=1e-9)
        assert v.decided == (ref.pvalue < 0.05)
        assert ("is the best" in v.text) == v.decided
    clear = decide(["g1", "g2"], list(cases[0]), [[1, 2, 3], [4, 5, 6]], "max")
    noise = decide(["g1", "g2"], list(cases[1]), [[1, 2, 3], [4, 5, 6]], "max")
    assert clear.decided and clear.seeds_needed is None and clear.winner == "g1"
    assert not noise.decided and noise.seeds_needed > 3 and "seeds per group" in noise.text
    assert noise.tied == ("g1", "g2")
    lower = decide(["g1", "g2"], [[0.1, 0.11, 0.12], [0.3, 0.31, 0.29]], [[1, 2, 3], [4, 5, 6]],
                   "min")  # fmt: skip
    assert lower.decided  # with mode=min, lower is better
    single = decide(["g1", "g2"], [[0.9], [0.8]], [[1], [2]], "max")
    assert not single.decided and "one run" in single.text


@pytest.mark.slow
def test_real_sweep_gets_a_seed_verdict_and_a_latex_table(sweep, tmp_path):
    res = run_inproc("-m", "experiments.compare", str(sweep), "out=cmp", "--latex", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    (line,) = [ln for ln in res.stdout.splitlines() if ln.startswith("Verdict: ")]
    assert "on val/acc" in line and "3 shared seeds" in line  # both lrs ran seeds 0, 1, 2
    assert ("is the best" in line) != ("no winner" in line or "tie on" in line)
    tex = (tmp_path / "cmp" / "compare.tex").read_text()
    assert tex.count("\\\\") == 3 and "\\begin{tabular}" in tex  # header + 2 groups
    assert "optimizer.lr" in tex and ("\\textbf{" in tex) == ("is the best" in line)


# ---------------------------------------------------------------- hostile run folders

ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
)


def test_hostile_run_files_are_skipped_one_line_each_and_the_rest_compared(tmp_path):
    """Files in a run folder are data: a YAML alias bomb, a python tag, deep nesting, bytes
    that are not UTF-8, numbers too large for a float, control characters and a job.json of
    the wrong shape each make that run a one-line reason on stderr; nothing hangs, nothing
    runs, and the good runs are compared."""
    root = tmp_path / "runs"
    lr_runs(root, {0.01: [0.8, 0.81], 0.05: [0.9, 0.91]})
    marker = tmp_path / "pwned"
    good = yaml.safe_dump(saved_config())
    bad_configs = {
        "bomb": ALIAS_BOMB,
        "tag": good + f'evil: !!python/object/apply:os.system ["touch {marker}"]\n',
        "deep": "x: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n",
        "selfref": good + "loop: &l [*l]\n",
        "latin1": good.encode().decode() + "label: caf\xe9\n",  # written as Latin-1 below
    }
    for name, text in bad_configs.items():
        run = write_run(root / f"cfg-{name}", saved_config(), {"test/acc": 0.5})
        data = text.encode("latin-1") if name == "latin1" else text.encode()
        (run / ".hydra" / "config.yaml").write_bytes(data)
    bad_metrics = {
        "deep": b"[" * 100_000 + b"]" * 100_000,
        "notutf8": b'\xff\xfe{"test/acc": 0.5}',
        "bigint": b'{"test/acc": ' + b"9" * 5000 + b"}",
        "huge": b'{"test/acc": 1e999}',
        "control": json.dumps({"test/acc": "\x1b[31m\nerror: fake line"}).encode(),
        "list": b"[1, 2]",
    }
    for name, data in bad_metrics.items():
        run = write_run(root / f"met-{name}", saved_config(), {"test/acc": 0.5})
        (run / "metrics.json").write_bytes(data)
    unfinished = root / "job-list"
    (unfinished / ".hydra").mkdir(parents=True)
    (unfinished / ".hydra" / "config.yaml").write_text(good)
    (unfinished / "job.json").write_text('["status", "failed"]')
    failed = root / "job-multiline"
    shutil.copytree(unfinished, failed)
    error = "Traceback (most recent call last):\n  File x\nValueError: boom"
    (failed / "job.json").write_text(json.dumps({"status": "failed", "error": error}))
    # a dict inside a list with keys of mixed types: compared (it once raised TypeError)
    write_run(root / "mixed-keys", saved_config(extra=[{1: "a", "b": "c"}]), {"test/acc": 0.7})

    res = run_inproc("-m", "experiments.compare", str(root), "out=cmp", "metric=test/acc",
                  cwd=tmp_path, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and not marker.exists()
    warned = [ln for ln in res.stderr.splitlines() if ln.strip()]
    broken = {f"cfg-{n}" for n in bad_configs} | {f"met-{n}" for n in bad_metrics}
    broken |= {"job-list", "job-multiline"}
    assert len(warned) == len(broken), res.stderr
    assert all(ln.startswith("warning: skipped ") for ln in warned), res.stderr
    why = {ln.split()[2].rstrip(":").rsplit("/", 1)[-1]: ln for ln in warned}
    assert set(why) == broken, sorted(why)
    assert "aliases expand to more than" in why["cfg-bomb"]
    assert "not valid YAML" in why["cfg-tag"] and "not UTF-8" in why["cfg-latin1"]
    assert "not UTF-8" in why["met-notutf8"] and "nested too deeply" in why["met-deep"]
    assert "not a finite number" in why["met-huge"] and "\\x1b" in why["met-control"]
    assert "the job failed (ValueError: boom)" in why["job-multiline"]
    md = (tmp_path / "cmp" / "compare.md").read_text()
    n = table_header(md).index("n")
    assert sorted(r[n] for r in table_rows(md)) == ["1", "2", "2"]  # 4 good runs + mixed-keys
    assert f"skipped {len(broken)} runs:" in md


def test_a_hostile_curve_file_is_no_curve(tmp_path):
    (tmp_path / "csv").mkdir()
    path = tmp_path / "csv" / "metrics.csv"
    for data in (b"epoch,val/acc\ninf,0.5\n", b"epoch,val/acc\n0,\xff\n", b"\x00" * 10):
        path.write_bytes(data)
        assert read_curve(tmp_path) == {}  # the run is compared; it only has no curve drawn
