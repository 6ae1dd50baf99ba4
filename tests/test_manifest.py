"""manifest.json: every artifact's sha256 and size; a one-byte change is found and named."""

from __future__ import annotations

import json

import pytest

from experiments.errors import UserError
from experiments.runs.manifest import (
    MANIFEST,
    TamperedError,
    check_integrity,
    check_tree,
    refresh,
    require_intact,
    write_manifest,
)


def _run(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / ".hydra").mkdir()
    (run / "checkpoints" / "best.safetensors").write_bytes(b"\x00" * 4096)
    (run / "metrics.json").write_text('{"val/acc": 0.9}')
    (run / "model.onnx").write_bytes(b"onnx" * 100)
    (run / ".hydra" / "config.yaml").write_text("seed: 1\n")
    (run / "train.log").write_text("grows\n")
    (run / "wandb").mkdir()
    (run / "wandb" / "run.wandb").write_text("rewritten by wandb sync")
    write_manifest(run)
    return run


def _flip(path, at=0):
    data = bytearray(path.read_bytes())
    data[at] ^= 1
    path.write_bytes(bytes(data))


def test_an_untouched_run_is_intact_and_logs_and_tracker_folders_are_not_listed(tmp_path):
    run = _run(tmp_path)
    listed = json.loads((run / MANIFEST).read_text())["files"]
    assert set(listed) == {
        "checkpoints/best.safetensors", "metrics.json", "model.onnx", ".hydra/config.yaml"
    }  # fmt: skip
    result = check_integrity(run)
    assert result.intact and result.checked == 4 and result.lines() == []
    (run / "train.log").write_text("more lines")  # a log may grow after the run
    assert check_integrity(run).intact


@pytest.mark.parametrize("name", ["checkpoints/best.safetensors", "metrics.json", "model.onnx"])
def test_one_flipped_byte_is_found_and_named(tmp_path, name):
    run = _run(tmp_path)
    _flip(run / name, at=2)
    result = check_integrity(run)
    assert not result.intact and result.modified == [name]
    assert str(run / name) in result.lines()[0]
    with pytest.raises(TamperedError, match=name.split("/")[-1]):
        require_intact(run, [name])
    require_intact(run, [name], trust_modified=True)  # told to: used anyway
    # any modified file refuses the whole run, whichever file the command reads
    with pytest.raises(TamperedError, match=name.split("/")[-1]):
        require_intact(run, [])


def test_a_missing_or_added_file_is_reported(tmp_path):
    run = _run(tmp_path)
    (run / "model.onnx").unlink()
    (run / "checkpoints" / "best.pt").write_bytes(b"swapped in")
    result = check_integrity(run)
    assert result.missing == ["model.onnx"] and result.unlisted == ["checkpoints/best.pt"]
    with pytest.raises(TamperedError, match="added after the run"):
        require_intact(run, [run / "checkpoints" / "best.pt"])


def test_an_older_run_without_a_manifest_is_a_note_not_a_failure(tmp_path):
    run = _run(tmp_path)
    (run / MANIFEST).unlink()
    result = check_integrity(run)
    assert not result.has_manifest and "no manifest.json" in result.lines()[0]
    require_intact(run, ["metrics.json"])  # nothing to check against: passes


def test_a_corrupt_or_hostile_manifest_is_one_line(tmp_path):
    run = _run(tmp_path)
    (run / MANIFEST).write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        check_integrity(run)
    (run / MANIFEST).write_text(
        json.dumps({"version": 1, "files": {"../x": {"sha256": "0", "size": 1}}})
    )
    with pytest.raises(UserError, match="malformed entry"):
        check_integrity(run)


def test_refresh_records_what_the_command_wrote_and_never_blesses_a_modified_file(tmp_path):
    run = _run(tmp_path)
    _flip(run / "metrics.json")  # tampered before the command opened the run
    before = require_intact(run, ["model.onnx"], trust_modified=True)
    (run / "model.onnx").write_bytes(b"exported again")  # what the command wrote
    (run / "eval_metrics.json").write_text("{}")
    refresh(run, before)
    result = check_integrity(run)
    assert result.modified == ["metrics.json"] and not result.unlisted  # still reported
    (run / MANIFEST).unlink()
    assert refresh(run, check_integrity(run)) is None and not (run / MANIFEST).exists()


def test_a_sweep_lists_its_own_files_and_each_job_its_own(tmp_path):
    sweep = tmp_path / "sweep"
    job = sweep / "0"
    (job / "checkpoints").mkdir(parents=True)
    (job / "metrics.json").write_text("{}")
    write_manifest(job)  # the job's run ends
    (job / "job.json").write_text('{"status": "done"}')  # then the sweep records it
    (sweep / "summary.md").write_text("| job |")
    write_manifest(sweep)
    assert set(json.loads((sweep / MANIFEST).read_text())["files"]) == {
        "summary.md", "0/job.json"
    }  # fmt: skip
    assert all(r.intact for r in check_tree(sweep))
    _flip(job / "metrics.json")
    _flip(job / "job.json")
    found = {str(r.folder): r.modified for r in check_tree(sweep)}
    assert found == {str(sweep): ["0/job.json"], str(job): ["metrics.json"]}
