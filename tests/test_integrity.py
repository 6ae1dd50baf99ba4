"""Tamper-evident runs (#34), through the real commands: one flipped byte in a run's weights,
metrics or exported model is named by ``experiments-verify integrity=true`` (exit 1), and
eval, predict and export refuse the run (exit 1, one line) unless ``trust_modified=true``."""

from __future__ import annotations

import json
import shutil

import pytest

from experiments.evaluation.saved_run import SavedRun
from experiments.runs.manifest import MANIFEST, check_integrity
from tests.helpers import run_inproc, train_cli

# the file, and the command then told to trust it, one that does not write that file again
# (each command refuses every file)
TAMPERED = {
    "checkpoints/best.safetensors": "export",
    "metrics.json": "predict",
    "model.onnx": "eval",
}


@pytest.fixture(scope="module")
def shipped(tmp_path_factory, data_dir):
    """A finished run (1 epoch) with its model exported to ONNX (export refreshes the run's
    manifest), and a few images."""
    root = tmp_path_factory.mktemp("integrity")
    run = train_cli(root / "run", data_dir, "trainer.max_epochs=1")
    res = run_inproc("-m", "experiments.export", f"run_dir={run}", "format=onnx", cwd=root)
    assert res.returncode == 0, res.stderr[-2000:]
    images = root / "images"
    images.mkdir()
    for path in sorted((data_dir / "digits" / "images").iterdir())[:3]:
        shutil.copy(path, images)
    return run, images


def _command(name: str, run, images, tmp_path, *extra: str):
    args = {
        "eval": ["-m", "experiments.eval", f"run_dir={run}"],
        "predict": ["-m", "experiments.predict", f"run_dir={run}", f"input={images}",
                    f"output={tmp_path / 'predictions.csv'}"],
        "export": ["-m", "experiments.export", f"run_dir={run}", "format=onnx"],
    }[name]  # fmt: skip
    return run_inproc(*args, *extra, cwd=tmp_path)


def _flip_one_byte(path):
    """Change one byte and keep the file readable: a digit of a JSON file (7 <-> 8), the
    last byte of a tensor or protobuf payload."""
    data = bytearray(path.read_bytes())
    if path.suffix == ".json":
        at = next(i for i, b in enumerate(data) if chr(b).isdigit())
        data[at] = ord("8") if data[at] == ord("7") else ord("7")
    else:
        data[-1] ^= 1
    path.write_bytes(bytes(data))


def test_a_finished_run_lists_its_weights_and_verify_integrity_says_intact(shipped, tmp_path):
    run, _ = shipped
    listed = json.loads((run / MANIFEST).read_text())["files"]
    assert {"checkpoints/best.safetensors", "checkpoints/last.safetensors"} <= set(listed)
    assert not any(name.endswith(".pt") for name in listed)  # no pickle-format weights
    assert {"metrics.json", "model.onnx", ".hydra/config.yaml"} <= set(listed)
    res = run_inproc("-m", "experiments.verify", str(run), "integrity=true", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
    assert res.stdout.startswith(f"intact: {run} (") and "match manifest.json" in res.stdout


@pytest.mark.parametrize("name", list(TAMPERED))
def test_one_flipped_byte_is_named_and_refused_unless_trusted(shipped, tmp_path, name):
    first, images = shipped
    run = tmp_path / "run"
    shutil.copytree(first, run)
    _flip_one_byte(run / name)
    res = run_inproc("-m", "experiments.verify", f"run_dir={run}", "integrity=true", cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr[-2000:]
    assert f"{run / name}: modified after the run (sha256 differs)" in res.stdout
    assert "NOT intact" in res.stdout and res.stdout.count("modified after") == 1
    for command in ("eval", "predict", "export"):
        res = _command(command, run, images, tmp_path)
        last = res.stderr.strip().splitlines()[-1]
        assert res.returncode == 1, f"{command}: {res.stderr[-2000:]}"
        assert last.startswith("error: ") and f"{run / name}: modified after the run" in last
        assert "trust_modified=true" in last and "Traceback" not in res.stderr
    trusting = TAMPERED[name]
    res = _command(trusting, run, images, tmp_path, "trust_modified=true")
    assert res.returncode == 0, f"{trusting}: {res.stderr[-2000:]}"
    assert "used anyway: trust_modified=true" in res.stderr
    res = run_inproc("-m", "experiments.verify", str(run), "--integrity", cwd=tmp_path)
    assert res.returncode == 1 and f"{run / name}: modified" in res.stdout  # never blessed


def test_a_missing_manifest_is_a_note_and_a_bad_option_is_one_line(shipped, tmp_path):
    first, images = shipped
    run = tmp_path / "run"
    shutil.copytree(first, run)
    (run / MANIFEST).unlink()  # a run written before manifests
    res = run_inproc("-m", "experiments.verify", f"run_dir={run}", "integrity=true", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.startswith(f"note: {run}: no manifest.json")
    res = _command("eval", run, images, tmp_path, "trust_modified=maybe")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == (
        "error: trust_modified='maybe' is not valid: expected true or false"
    )


def test_a_command_records_what_it_wrote_and_nothing_else(shipped, tmp_path):
    first, _ = shipped
    run = tmp_path / "run"
    shutil.copytree(first, run)
    opened = SavedRun(run)  # checks the manifest first
    (run / "eval_metrics.json").write_text("{}")  # what a command writes into the run
    opened.refresh_manifest()
    assert check_integrity(run).intact
    (run / "metrics.json").write_text("{}")  # modified after the run
    opened = SavedRun(run, overrides=["trust_modified=true"])
    (run / "eval_metrics.json").write_text('{"test/acc": 1}')
    opened.refresh_manifest()
    assert check_integrity(run).modified == ["metrics.json"]  # still reported, not blessed


def test_compare_into_a_run_records_its_report_in_the_manifest(shipped, tmp_path):
    first, _ = shipped
    run = tmp_path / "run"
    shutil.copytree(first, run)
    res = run_inproc("-m", "experiments.compare", str(run), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (run / "compare.md").is_file()
    res = run_inproc("-m", "experiments.verify", f"run_dir={run}", "integrity=true", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.startswith("intact"), res.stdout
