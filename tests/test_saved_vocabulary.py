"""A run folder is data, not a program (trust round 4): eval, predict, calibrate and export
rebuild a run from a closed vocabulary, check every node before building any, and write
nowhere but the run folder and the file they were told. One test per family of attack; a
marker file proves that nothing ran."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import yaml

from experiments.errors import UserError
from experiments.evaluation.evaluate import evaluate
from experiments.evaluation.prediction import predict
from experiments.runs.layout import RunDir
from tests.helpers import (
    REPO,
    Payload,
    assert_one_line_error,
    edit_config,
    run_inproc,
    train_cli,
)


@pytest.fixture
def run(trained_run, tmp_path) -> Path:
    """A private copy of the run, free to tamper with: without its manifest.json, as an older
    run has none, so the vocabulary's own checks answer (the manifest's are test_manifest's)."""
    copy = Path(shutil.copytree(trained_run, tmp_path / "run"))
    RunDir(copy).manifest.unlink(missing_ok=True)
    return copy


@pytest.fixture
def images(data_dir, tmp_path) -> Path:
    folder = tmp_path / "images"
    folder.mkdir()
    for name in sorted((data_dir / "digits" / "images").iterdir())[:3]:
        shutil.copy(name, folder)
    return folder


def _tamper_transform(run: Path, node: dict) -> None:
    edit_config(run, lambda cfg: cfg["data"].update(target_transform=node))


def _refused(run: Path, marker: Path, match: str) -> None:
    with pytest.raises(UserError, match=match) as info:
        evaluate(run)
    assert "\n" not in str(info.value)
    assert not marker.exists(), "the payload ran"


def test_a_function_that_starts_a_shell_is_refused(run, tmp_path):
    marker = tmp_path / "marker"
    node = {"_target_": "torch.utils.collect_env.run", "command": f"touch {marker}"}
    _tamper_transform(run, node)
    named = r"data\.target_transform\._target_='torch\.utils\.collect_env\.run' is refused"
    _refused(run, marker, named + r": a saved run may name only torchvision\.transforms\.v2")


def test_a_target_that_writes_a_file_is_refused_and_its_nested_nodes_never_built(run, tmp_path):
    marker = tmp_path / "marker"
    data = {"_target_": "torch.tensor", "data": [104, 105], "dtype": {
        "_target_": "hydra.utils.get_object", "path": "torch.uint8"}}  # fmt: skip
    _tamper_transform(run, {"_target_": "torchvision.io.write_file", "filename": str(marker),
                            "data": data})  # fmt: skip
    _refused(run, marker, r"torchvision\.io\.write_file' is refused")


def test_load_from_checkpoint_is_refused(run, tmp_path):
    import torch

    marker, evil = tmp_path / "marker", tmp_path / "evil.ckpt"
    torch.save({"state_dict": Payload(str(marker))}, evil)
    node = {
        "_target_": "experiments.models.ClassificationModule.load_from_checkpoint",
        "checkpoint_path": str(evil),
        "weights_only": False,
    }
    _tamper_transform(run, node)
    _refused(run, marker, r"ClassificationModule\.load_from_checkpoint' is refused")


def test_nothing_from_hydra_is_called(run, tmp_path):
    marker = tmp_path / "marker"

    def tamper(cfg):
        steps = cfg["data"]["train_transform"]["transforms"]
        steps[1]["dtype"]["path"] = "torch.utils.collect_env.run"  # get_object -> a function
        cfg["data"]["augment"] = {"_target_": "hydra.utils.call", "config": {
            "_target_": "torch.utils.collect_env.run", "command": f"touch {marker}"}}  # fmt: skip

    edit_config(run, tamper)
    _refused(run, marker, r"hydra\.utils\.(get_object|call)'? is refused")
    edit_config(run, lambda cfg: cfg["data"].update(augment=None))
    _refused(run, marker, r"_transform\.transforms\.1\.dtype\._target_='hydra\.utils\.get_object' "
                          r"is refused")  # fmt: skip


def test_a_function_target_even_of_ours_is_refused_and_a_nested_payload_never_runs(run, tmp_path):
    marker = tmp_path / "marker"
    payload = {"_target_": "experiments.data.export_digits", "root": str(marker)}

    def nested(cfg):  # a valid transform around a payload in one of its arguments
        cfg["data"]["train_transform"]["transforms"][2]["mean"] = payload

    edit_config(run, nested)
    _refused(run, marker, r"data\.\w+_transform\.transforms\.2\.mean\._target_="
                          r"'experiments\.data\.export_digits' is refused")  # fmt: skip
    edit_config(run, lambda cfg: cfg["data"]["train_transform"]["transforms"][2].update(mean=[0.3]))
    edit_config(run, lambda cfg: cfg["model"]["net"].update(_target_=payload["_target_"]))
    _refused(run, marker, r"model\.net\._target_='experiments\.data\.export_digits' is refused")


def test_an_unknown_key_is_refused_before_anything_is_built(run, tmp_path):
    marker = tmp_path / "marker"

    def tamper(cfg):
        cfg["model"]["net"]["hiden"] = 3  # a typo: the real signature has no such argument
        cfg["data"]["augment"] = {"_target_": "experiments.data.export_digits", "root": str(marker)}

    edit_config(run, tamper)
    with pytest.raises(UserError, match=r"export_digits' is refused|no argument 'hiden'"):
        evaluate(run)
    assert not marker.exists()
    edit_config(run, lambda cfg: cfg["data"].update(augment=None))
    with pytest.raises(UserError, match=r"model\.net\.hiden: experiments\.models\.\w+ has no "
                                        r"argument 'hiden'; it takes"):  # fmt: skip
        evaluate(run)


def test_the_environment_is_never_read_from_a_saved_config(run, data_dir, monkeypatch):
    monkeypatch.setenv("CANARY_ROOT", str(data_dir / "digits"))
    edit_config(run, lambda cfg: cfg["data"].update(root="${oc.env:CANARY_ROOT}"))
    with pytest.raises(UserError, match=r"data\.root='\$\{oc\.env:CANARY_ROOT\}' is refused: "
                                        r"only references"):  # fmt: skip
        evaluate(run)
    # plain references still resolve, a relative one too
    edit_config(run, lambda cfg: cfg["data"].update(root="${paths.data_dir}/digits"))
    edit_config(run, lambda cfg: cfg["data"].update(eval_transform="${.train_transform}"))
    assert 0.0 <= evaluate(run)["test/acc"] <= 1.0


@pytest.mark.parametrize("shape", [None, [3, 100000, 100000], [1, 8], "x", [1, -8, 8]])
def test_a_null_or_huge_in_shape_in_the_sidecar_is_one_line(run, images, shape):
    (run / "predictions.csv").unlink(missing_ok=True)  # another test's predict, on this run
    best = run / "checkpoints" / "best.json"
    sidecar = json.loads(best.read_text())
    sidecar["in_shape"] = shape
    best.write_text(json.dumps(sidecar))
    start = time.perf_counter()
    with pytest.raises(UserError, match=r"best\.json: in_shape=.* is not valid: expected"):
        predict(run, images)
    assert time.perf_counter() - start < 30
    assert not (run / "predictions.csv").exists()


def test_a_yaml_alias_bomb_in_the_saved_config_is_one_line_and_fast(run, tmp_path):
    lines = ['a0: ["x","x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: [{','.join(['*a' + str(i - 1)] * 10)}]" for i in range(1, 9)]
    bomb = "\n".join(f"{ln.split(':')[0]}: &{ln.split(':')[0]} {ln.split(': ', 1)[1]}"
                     for ln in lines)  # fmt: skip
    (run / ".hydra" / "config.yaml").write_text(bomb + "\n")
    start = time.perf_counter()
    res = run_inproc("-m", "experiments.eval", f"run_dir={run}", cwd=tmp_path)
    assert_one_line_error(res, "aliases expand to more than")
    assert time.perf_counter() - start < 60


@pytest.mark.parametrize(
    ("command", "value", "named"),
    [
        ("eval", "abc", "data.batch_size='abc' is not valid"),
        ("predict", "-4", "data.batch_size=-4 is not valid"),
        ("predict", "abc", "data.batch_size='abc' is not valid"),
    ],
)
def test_eval_and_predict_check_override_types_and_bounds(run, images, tmp_path, command, value,
                                                          named):  # fmt: skip
    out = tmp_path / "out.csv"
    extra = [f"input={images}", f"output={out}"] if command == "predict" else []
    res = run_inproc("-m", f"experiments.{command}", f"run_dir={run}", *extra,
                  f"data.batch_size={value}", cwd=tmp_path)  # fmt: skip
    assert_one_line_error(res, named)
    assert not out.exists()


@pytest.mark.parametrize(
    "name", ["best weights", "checkpoints/best.json", "metrics.json", ".hydra/config.yaml"]
)
def test_predict_output_may_not_replace_a_file_of_the_run(run, images, tmp_path, name):
    target = RunDir(run).best_weights if name == "best weights" else run / name
    before = target.read_bytes()
    res = run_inproc("-m", "experiments.predict", f"run_dir={run}", f"input={images}",
                  f"output={target}", cwd=tmp_path)  # fmt: skip
    assert_one_line_error(res, "a file of the run")
    assert target.read_bytes() == before
    link = tmp_path / "link.csv"  # a path that resolves to one is refused as well
    link.symlink_to(target)
    with pytest.raises(UserError, match="a file of the run"):
        predict(run, images, output=link)
    assert target.read_bytes() == before
    # a new file in the run folder, or an earlier predictions CSV, is fine
    assert predict(run, images, output=run / "mine.csv") == run / "mine.csv"
    assert predict(run, images, output=run / "mine.csv") == run / "mine.csv"


def test_eval_writes_no_statistics_outside_the_run(tmp_path, data_dir):
    run = Path(shutil.copytree(REPO / "tests" / "data" / "run_2026_12_04_cnn", tmp_path / "r"))
    (run / "data_stats.json").unlink()  # mean=auto: eval would compute and write them
    outside = tmp_path / "elsewhere" / "stats.json"
    res = run_inproc("-m", "experiments.eval", f"run_dir={run}", f"paths.data_dir={data_dir}",
                  f"data.stats_file={outside}", cwd=tmp_path)  # fmt: skip
    assert_one_line_error(res, "is outside the run folder")
    assert not outside.exists() and not outside.parent.exists()


def test_a_corrupt_statistics_file_is_one_line(tmp_path, data_dir):
    run = Path(shutil.copytree(REPO / "tests" / "data" / "run_2026_12_04_cnn", tmp_path / "r"))
    (run / "data_stats.json").write_text('{"mean": [0.5], "std": "x"}')
    with pytest.raises(UserError, match=r"data_stats\.json: data statistics must be"):
        evaluate(run, overrides=[f"paths.data_dir={data_dir}"])


def test_your_own_package_is_trusted_only_when_named(tmp_path, data_dir, monkeypatch):
    run = train_cli(
        tmp_path / "own", data_dir, "trainer.max_epochs=1", "logger=none", "model=mlp",
        "data.dataset={_target_:tests.helpers.random_sets,_partial_:true,n:64}",
    )  # fmt: skip
    monkeypatch.delenv("EXPERIMENTS_TRUSTED_MODULES", raising=False)
    with pytest.raises(UserError, match=r"data\.dataset\._target_='tests\.helpers\.random_sets' "
                                        r"is refused.*EXPERIMENTS_TRUSTED_MODULES"):  # fmt: skip
        evaluate(run)
    monkeypatch.setenv("EXPERIMENTS_TRUSTED_MODULES", "tests.helpers")
    trained = json.loads((run / "metrics.json").read_text())["test/acc"]
    assert evaluate(run)["test/acc"] == trained


def test_the_saved_trainer_node_is_never_built(run, tmp_path):
    marker = tmp_path / "marker"
    payload = {"_target_": "experiments.data.export_digits", "root": str(marker)}

    def tamper(cfg):
        cfg["trainer"]["strategy"] = payload
        cfg["trainer"]["callbacks"] = [payload]

    edit_config(run, tamper)
    assert 0.0 <= evaluate(run)["test/acc"] <= 1.0
    assert not marker.exists()
    with pytest.raises(UserError, match=r"override trainer\.strategy: not used"):
        evaluate(run, overrides=["trainer.strategy=ddp"])


def test_non_plain_yaml_is_refused(run):
    path = run / ".hydra" / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["data"]["root"] = b"bytes"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(UserError, match=r"data\.root holds a bytes, not plain data"):
        evaluate(run)


def test_eval_exports_and_downloads_nothing(run, tmp_path):
    # training exports the digits under data.root; a saved run only reads them
    elsewhere = tmp_path / "nowhere"
    with pytest.raises(UserError, match=r"data\.root=.*nowhere/digits: the run's digits are not"):
        evaluate(run, overrides=[f"paths.data_dir={elsewhere}"])
    assert not elsewhere.exists()


def test_a_run_trained_with_the_default_paths_evals(run, data_dir, tmp_path, monkeypatch):
    # what a user's run saves when paths.* were left alone: conf/paths/default.yaml's own
    # resolver text, resolved as that file says (EXPERIMENTS_ROOT or the current folder)
    def default_paths(cfg):
        cfg["paths"].update(root_dir="${oc.env:EXPERIMENTS_ROOT,.}",
                            data_dir="${paths.root_dir}/data")  # fmt: skip
        cfg["data"].update(root="${paths.data_dir}/digits")

    edit_config(run, default_paths)
    root = tmp_path / "project"  # as if trained in it: <root>/data/digits
    (root / "data").mkdir(parents=True)
    (root / "data" / "digits").symlink_to(data_dir / "digits")
    monkeypatch.setenv("EXPERIMENTS_ROOT", str(root))
    assert "test/acc" in evaluate(run)
    # the same resolver under any other text, or another key, is still refused
    edit_config(run, lambda cfg: cfg["paths"].update(root_dir="${oc.env:EXPERIMENTS_ROOT}"))
    with pytest.raises(UserError, match=r"paths\.root_dir=.* is refused: only references"):
        evaluate(run)
