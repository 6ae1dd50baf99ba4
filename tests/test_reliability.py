"""Never lose a run: exact resume, signals, kills, corrupt checkpoints, divergence, config
mistakes, secrets and provenance. Real processes wherever signals are involved."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import random
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from experiments.errors import UserError, find_user_error
from experiments.runs.checkpoint_io import AtomicCheckpointIO, newest_valid_checkpoint
from experiments.runs.layout import RunDir
from experiments.runs.weights import read_state_dict
from experiments.training.pipeline import train
from tests.helpers import (
    EXACT,
    REPO,
    Payload,
    assert_same_training_state,
    data_position,
    run_cli,
    run_inproc,
    run_process,
)

# its runs use targets of tests.helpers, which a resumed run may replay only when trusted
ENV = {"PYTHONPATH": str(REPO), "EXPERIMENTS_TRUSTED_MODULES": "tests.helpers"}


def _load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def _cli(tmp_path, *args, **kw):
    res = run_cli("-m", "experiments.train", *args, cwd=tmp_path, env_extra=ENV, **kw)
    return res


@pytest.mark.slow
def test_two_epochs_plus_resume_plus_two_equal_four_bit_for_bit(make_cfg, tmp_path):
    # in-process train() calls: the same code path as the CLI after its precheck
    def run(name, *extra):
        return train(make_cfg(*EXACT, f"paths.output_dir={tmp_path / name}", *extra))

    run("A", "trainer.max_epochs=4")
    run("B", "trainer.max_epochs=2")
    run("B", "trainer.max_epochs=4", f"resume={tmp_path / 'B'}")
    assert_same_training_state(
        tmp_path / "A/checkpoints/last.ckpt", tmp_path / "B/checkpoints/last.ckpt"
    )


def _data(*, signal_at: int | None = None, signum: int = signal.SIGTERM) -> list[str]:
    """640 random samples (544 after the val/test split: 17 batches an epoch); optionally a
    signal sent by the run itself right after training step ``signal_at`` (no guessed sleeps)."""
    args = [
        "data.dataset={_target_:tests.helpers.random_sets,_partial_:true,n:640}",
        "data.batch_size=32",
        "trainer.max_epochs=3",
    ]
    if signal_at is not None:
        args += [
            "+callbacks.signal_at._target_=tests.helpers.SignalAt",
            f"+callbacks.signal_at.step={signal_at}",
            f"+callbacks.signal_at.signum={int(signum)}",
        ]
    return args


@pytest.mark.slow
def test_sigterm_mid_epoch_saves_exits_143_and_resumes_exactly(tmp_path, data_dir):
    common = [*EXACT, f"paths.data_dir={data_dir}"]
    # the uninterrupted reference in-process; the signalled run and its resume are processes
    ref = run_inproc("-m", "experiments.train", *common, *_data(), "hydra.run.dir=A",
                     cwd=tmp_path, env_extra=ENV)  # fmt: skip
    assert ref.returncode == 0, ref.stderr[-2000:]
    res = _cli(tmp_path, *common, *_data(signal_at=30), "hydra.run.dir=B")
    assert res.returncode == 143, res.stderr[-2000:]
    assert "resume with: python -m experiments.train resume=" in res.stdout + res.stderr
    # saved right after step 30: epoch 1 (17 batches an epoch), 13 of its batches done
    assert data_position(tmp_path / "B/checkpoints/last.ckpt") == {"epoch": 1, "batches": 13}
    assert _load(tmp_path / "B/checkpoints/last.ckpt")["global_step"] == 30
    assert not (tmp_path / "B" / "metrics.json").exists()
    res = run_inproc("-m", "experiments.train", "resume=B", cwd=tmp_path, env_extra=ENV)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "resuming mid-epoch: epoch 2 after its first 13 batches" in res.stdout + res.stderr
    assert_same_training_state(
        tmp_path / "A/checkpoints/last.ckpt", tmp_path / "B/checkpoints/last.ckpt"
    )


@pytest.mark.slow
def test_sigint_saves_and_exits_130(tmp_path, data_dir):
    run = tmp_path / "outputs/train/runs/interrupted"
    args = ["logger=none", f"paths.data_dir={data_dir}", *_data(signal_at=25, signum=2)]
    res = _cli(tmp_path, *args, f"hydra.run.dir={run}")
    assert res.returncode == 130, res.stderr[-2000:]
    assert data_position(run / "checkpoints/last.ckpt") == {"epoch": 1, "batches": 8}
    assert not (run / "metrics.json").exists()


def test_resume_auto_picks_the_newest_unfinished_run_with_its_overrides(tmp_path, monkeypatch):
    from experiments.cli.check import precheck
    from experiments.config import CONF_DIR

    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "outputs" / "train" / "runs"
    for name, finished in (("old", False), ("done", True), ("new", False)):
        (runs / name / ".hydra").mkdir(parents=True)
        (runs / name / "checkpoints").mkdir()
        (runs / name / "checkpoints" / "last.ckpt").write_bytes(b"x")
        (runs / name / ".hydra" / "overrides.yaml").write_text("- optimizer.lr=0.05\n")
        if finished:
            (runs / name / "metrics.json").write_text("{}")
    for age, name in enumerate(("new", "done", "old")):  # distinct times, set, not waited for
        stamp = time.time() - 100 * (age + 1)
        os.utime(runs / name, (stamp, stamp))
    argv = precheck(["resume=auto", "trainer.max_epochs=9"], str(CONF_DIR))
    new = (runs / "new").resolve()
    assert argv == [
        "optimizer.lr=0.05",
        "trainer.max_epochs=9",
        f"resume={new}",
        f"hydra.run.dir={new}",
    ]
    with pytest.raises(UserError, match="model.net.dropout cannot change when resuming"):
        precheck(["resume=auto", "model.net.dropout=0.5"], str(CONF_DIR))
    with pytest.raises(UserError, match="cannot be combined with -m"):
        precheck(["-m", "resume=auto"], str(CONF_DIR))


def _save_forever(folder: Path, saved) -> None:
    torch.set_num_threads(1)
    io, step = AtomicCheckpointIO(), 0
    while True:
        step += 1
        state = {f"w{i}": torch.full((100, 100), float(step)) for i in range(8)}
        io.save_checkpoint({"state_dict": state, "global_step": step}, folder / "last.ckpt")
        saved.set()  # the parent kills only a writer that has written (an event, not a sleep)


def test_twenty_sigkills_never_leave_no_loadable_checkpoint(tmp_path):
    AtomicCheckpointIO().save_checkpoint(
        {"state_dict": {"w0": torch.zeros(2)}, "global_step": 0}, tmp_path / "last.ckpt"
    )
    rng = random.Random(1)
    ctx = mp.get_context("fork")
    for _ in range(20):
        saved = ctx.Event()
        proc = ctx.Process(target=_save_forever, args=(tmp_path, saved))
        proc.start()
        assert saved.wait(timeout=300), "the writer never saved a checkpoint"
        time.sleep(rng.uniform(0.0, 0.1))  # where in the next save the kill lands
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        found = newest_valid_checkpoint(tmp_path)
        assert found is not None, sorted(p.name for p in tmp_path.iterdir())
        _, ckpt = found
        step = ckpt["global_step"]
        assert all(
            torch.equal(t, torch.full_like(t, float(step)))
            for t in ckpt["state_dict"].values()
            if step
        )


@pytest.mark.slow
def test_sigkill_during_training_then_resume_finishes(tmp_path, data_dir):
    args = ["logger=none", f"paths.data_dir={data_dir}", *_data(signal_at=30, signum=9)]
    res = _cli(tmp_path, *args, "hydra.run.dir=K")
    assert res.returncode == -signal.SIGKILL  # no checkpoint at the kill: epoch 0's is kept
    assert _load(tmp_path / "K/checkpoints/last.ckpt")["global_step"] == 17
    res = run_inproc(  # not killed again
        "-m", "experiments.train", "resume=K", "callbacks.signal_at.step=-1", cwd=tmp_path,
        env_extra=ENV,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    metrics = json.loads((tmp_path / "K" / "metrics.json").read_text())
    assert metrics["epochs"] == 3


# -- in-process checks ---------------------------------------------------------------


def _user_error(fn) -> str:
    with pytest.raises(Exception) as info:
        fn()
    err = find_user_error(info.value)
    assert err is not None, info.value
    return str(err)


def test_corrupt_newest_checkpoint_falls_back_and_payload_never_runs(make_cfg, tmp_path, caplog):
    train(make_cfg("trainer.max_epochs=2", "logger=none", "test=false"))
    ckpt = tmp_path / "run" / "checkpoints"
    assert (ckpt / "last.ckpt.prev").is_file()
    canary = tmp_path / "pwned"
    for content in (b"", (ckpt / "last.ckpt").read_bytes()[:5000], None):
        if content is None:
            with open(ckpt / "last.ckpt", "wb") as f:
                pickle.dump({"state_dict": Payload(str(canary))}, f)
        else:
            (ckpt / "last.ckpt").write_bytes(content)
        (ckpt / ".last.ckpt.abc.tmp").write_bytes(b"half-written")
        prev = _load(ckpt / "last.ckpt.prev")
        assert prev["epoch"] == 0
        caplog.clear()
        found = newest_valid_checkpoint(ckpt)
        assert found is not None and found[0].name == "last.ckpt.prev"
        assert "last.ckpt" in caplog.text
        assert not canary.exists()
        (ckpt / "last.ckpt").write_bytes(b"")
    # resume goes on from the previous checkpoint, says so, and cleans the temp file
    metrics = train(
        make_cfg("trainer.max_epochs=2", "logger=none", "test=false", f"resume={tmp_path / 'run'}")
    )
    assert "falling back" in caplog.text
    assert not list(ckpt.glob(".*.tmp"))
    assert metrics["val/acc"] > 0 and not canary.exists()


def test_non_finite_loss_on_an_epochs_last_step_is_caught_before_its_checkpoints(
    make_cfg, tmp_path
):
    """The finite-loss flag is read a step late, except at the epoch's last step and before
    any checkpoint or validation: a NaN there leaves epoch 1's checkpoints and no other."""
    cfg = make_cfg(  # 168 train samples = 6 batches (5 x 32 + 8); a read past 330 gives
        # NaN: in the last batch of epoch 2 (reads 329-336)
        "data.dataset={_target_:tests.helpers.random_sets,_partial_:true,n:200,nan_after:330}",
        "data.batch_size=32",
        "trainer.max_epochs=3",
        "logger=none",
        "trainer.num_sanity_val_steps=0",
    )
    message = _user_error(lambda: train(cfg))
    assert "training loss is nan at step 12 (epoch 2, batch 6)" in message
    ckpt = tmp_path / "run" / "checkpoints"
    full = _load(ckpt / "last.ckpt")
    assert (full["epoch"], full["global_step"]) == (0, 6)  # epoch 1's, not epoch 2's
    assert all(torch.isfinite(v).all() for v in full["state_dict"].values())
    last = read_state_dict(RunDir(tmp_path / "run").last_weights)
    assert all(torch.isfinite(v).all() for v in last.values())


def test_resume_after_the_last_epoch_still_records_validation_metrics(make_cfg, tmp_path):
    """Stopped during test (every epoch checkpointed, no metrics.json): the resumed run has
    no epoch left to train, validates the restored weights again and records the same
    val/* values, so a sweeper or a cross-validation still gets its metric."""
    first = train(make_cfg("trainer.max_epochs=2", "logger=none"))
    run = tmp_path / "run"
    (run / "metrics.json").unlink()
    again = train(make_cfg("trainer.max_epochs=2", "logger=none", f"resume={run}"))
    for key in ("val/acc", "val/loss", "val/macro_f1", "test/acc"):
        assert again[key] == pytest.approx(first[key], abs=1e-6), key
    assert json.loads((run / "metrics.json").read_text())["val/acc"] == pytest.approx(
        first["val/acc"], abs=1e-6
    )


def test_unfinished_run_is_not_restarted_and_finished_one_not_retrained(make_cfg, tmp_path):
    train(make_cfg("trainer.max_epochs=1", "logger=none"))
    message = _user_error(lambda: train(make_cfg("trainer.max_epochs=1", "logger=none")))
    assert "already holds checkpoints" in message and "resume=" in message
    run = tmp_path / "run"
    message = _user_error(
        lambda: train(make_cfg("trainer.max_epochs=1", "logger=none", f"resume={run}"))
    )
    assert "already finished 1 epochs" in message
    # raising max_epochs continues it
    metrics = train(make_cfg("trainer.max_epochs=2", "logger=none", f"resume={run}"))
    assert json.loads((run / "metrics.json").read_text())["epochs"] == 2
    assert 0.0 < metrics["test/acc"] <= 1.0


def test_non_finite_loss_stops_within_the_step_and_keeps_finite_checkpoints(make_cfg, tmp_path):
    cfg = make_cfg(
        "data.dataset={_target_:tests.helpers.random_sets,_partial_:true,n:200,nan_after:250}",
        "data.batch_size=32",
        "trainer.max_epochs=3",
        "logger=none",
        "trainer.num_sanity_val_steps=0",
    )
    message = _user_error(lambda: train(cfg))
    assert "training loss is nan at step" in message
    step = int(message.split("at step ")[1].split()[0])
    assert 5 <= step <= 9  # 250 reads = the 8th batch of 32; sample 250 is in batch 8
    ckpt = tmp_path / "run" / "checkpoints"
    full = _load(ckpt / "last.ckpt")
    assert all(torch.isfinite(v).all() for v in full["state_dict"].values())
    last = read_state_dict(RunDir(tmp_path / "run").last_weights)
    assert all(torch.isfinite(v).all() for v in last.values())
    assert full["global_step"] < step


def test_same_seed_same_metrics(make_cfg, tmp_path):
    def once(name):
        cfg = make_cfg(
            "seed=0",
            "trainer.deterministic=true",
            "debug=limit",
            f"paths.output_dir={tmp_path / name}",
            "data.num_workers=2",
        )
        train(cfg)
        data = json.loads((tmp_path / name / "metrics.json").read_text())
        return {k: v for k, v in data.items() if k not in ("run_dir", "wall_time_s")}

    a, b = once("a"), once("b")
    assert a == b and a["seed"] == 0 and "test/acc" in a


def test_env_json_records_provenance(make_cfg, tmp_path):
    train(make_cfg("debug=fast", "seed=7"))
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert env["seed"] == 7 and env["device"] == "cpu"
    assert env["torch"] == torch.__version__ and env["python"] and env["hostname"]
    assert isinstance(env["command"], list) and env["lightning"] and env["hydra"]
    assert "git_commit" in env and "git_dirty" in env
    if env["git_dirty"]:
        assert (tmp_path / "run" / "git.diff").is_file()


# -- the command line: malformed input ---------------------------------------------------

MALFORMED = [
    ("foo=1", "foo"),
    ("model=nope", "model=nope"),
    ("experiment=nope", "experiment=nope"),
    ("debug=nope", "debug=nope"),
    ("logger=nope", "logger=nope"),
    ("hparams_search=nope", "hparams_search=nope"),
    ("optimizer.lr=abc", "optimizer.lr"),
    ("optimizer.lr=-1", "optimizer.lr"),
    ("data.batch_size=0", "data.batch_size"),
    ("data.batch_size=1.5", "data.batch_size"),
    ("data.num_workers=-2", "data.num_workers"),
    ("seed=abc", "seed"),
    ("trainer.max_epochs=abc", "trainer.max_epochs"),
    ("trainer.accelerator=abacus", "trainer.accelerator"),
    ("test=maybe", "test"),
    ("optimized_mode=up", "optimized_mode"),
    ("data=image_csv", "data.csv_file"),
    ("model.net._target_=experiments.models.MLPP", "MLPP"),
    ("model.net._target_=nopkg.Net", "nopkg"),
    ("optimizer._target_=torch.optim.SGDD", "SGDD"),
    ("optimizer.lr=[1", "cannot parse"),
    ("+logger.wandb.api_key=sk-123", "environment"),
    ("+trainer.token=abc", "environment"),
    ("+db.password=hunter2", "environment"),
    ("resume=/no/such/run", "/no/such/run"),
    # constructor keys are bound to the imported signatures before anything is built
    ("+trainer.nosuch=1", "trainer.nosuch"),
    ("+trainer.max_epoch=3", "did you mean trainer.max_epochs"),
    ("+model.net.hidden=[3]", "did you mean model.net.hidden_sizes"),
    ("+optimizer.learning_rate=0.1", "optimizer.learning_rate"),
]


@pytest.mark.parametrize(("override", "named"), MALFORMED)
def test_malformed_override_is_refused_before_hydra_in_one_line(
    tmp_path, monkeypatch, override, named
):
    from experiments.cli.check import precheck
    from experiments.config import CONF_DIR

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as err:
        precheck([override], str(CONF_DIR))
    message = str(err.value)
    assert named in message and "\n" not in message
    assert not (tmp_path / "outputs").exists()  # nothing ran, no run dir


@pytest.mark.parametrize(("override", "named"), [MALFORMED[1], ("+trainer.nosuch=1", "nosuch")])
def test_malformed_override_on_the_command_line_is_one_line_exit_2(tmp_path, override, named):
    res = run_inproc("-m", "experiments.train", override, cwd=tmp_path)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert named in lines[0]
    assert "Traceback" not in res.stdout + res.stderr
    assert not (tmp_path / "outputs").exists()  # nothing ran, no run dir


def test_unknown_keys_and_top_level_values_answer_before_torch_is_imported(tmp_path):
    # a wrong type of a constructor argument is bound to the imported signature; an unknown
    # key (Hydra's struct mode) and the top-level sections need no import
    code = (
        "import sys\nfrom experiments.cli.check import precheck\nfrom experiments.config "
        "import CONF_DIR\nfor arg in ('trainer.max_epoch=3', 'seed=abc'):\n    try:\n"
        "        precheck([arg], str(CONF_DIR))\n    except Exception as e:\n"
        "        print(type(e).__name__)\nprint('torch' in sys.modules, "
        "'lightning' in sys.modules)"
    )
    out = run_process([sys.executable, "-c", code], cwd=tmp_path).stdout.split()
    assert out == ["UserError", "UserError", "False", "False"]


@pytest.mark.slow
def test_secrets_never_reach_the_run_dir(tmp_path, data_dir):
    canary = "CANARY-SECRET-7f3a9"
    res = run_inproc(
        "-m",
        "experiments.train",
        "logger=wandb",
        "logger.wandb.mode=offline",
        "debug=limit",
        f"paths.data_dir={data_dir}",
        cwd=tmp_path,
        env_extra={"WANDB_API_KEY": canary},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    res = run_inproc("-m", "experiments.train", f"+logger.wandb.api_key={canary}", cwd=tmp_path)
    assert res.returncode != 0 and "environment" in res.stderr
    hits = [
        p
        for p in (tmp_path / "outputs").rglob("*")
        if p.is_file() and canary.encode() in p.read_bytes()
    ]
    assert hits == []
    assert list((tmp_path / "outputs").rglob("run-*.wandb"))  # the W&B run was written


@pytest.mark.slow
def test_a_secret_interpolated_under_an_ordinary_key_never_reaches_files_or_console(
    tmp_path, data_dir
):
    canary = "CANARY-TOKEN-a41c"
    res = run_inproc(
        *("-m", "experiments.train", "logger=wandb", "logger.wandb.mode=offline", "debug=limit"),
        *("+note=${oc.env:MY_SECRET_TOKEN}", "+plain=${oc.env:MY_PLAIN_SETTING}"),
        f"paths.data_dir={data_dir}",
        cwd=tmp_path,
        env_extra={"MY_SECRET_TOKEN": canary, "MY_PLAIN_SETTING": "visible-setting"},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert canary not in res.stdout + res.stderr
    # git.diff: the checkout's own uncommitted changes (this test's source, when run dirty)
    files = [p for p in (tmp_path / "outputs").rglob("*") if p.is_file() and p.name != "git.diff"]
    assert [p for p in files if canary.encode() in p.read_bytes()] == []
    (hparams,) = (tmp_path / "outputs").rglob("hparams.yaml")
    text = hparams.read_text()
    assert "note: <redacted>" in text and "plain: visible-setting" in text  # only the secret
    assert list((tmp_path / "outputs").rglob("run-*.wandb"))
