"""Test-time augmentation beyond eval: ``predict tta=`` writes the mean softmax over each
image's views, training's test reports ``test/tta/*`` (``model.tta``) as eval's ``tta=``
does, and a run of another task, or a mode that does not exist, is one line."""

from __future__ import annotations

import pytest
import torch

from experiments.evaluation.prediction import predict
from experiments.evaluation.saved_run import SavedRun
from experiments.models.tta import tta_views
from experiments.recorded.saved_net import build_net
from experiments.runs.files import read_json
from tests.helpers import assert_one_line_error, prediction_rows, run_inproc, train_cli


def test_predict_flip_is_the_mean_softmax_of_each_image_and_its_mirror(
    trained_run, few_images, tmp_path
):
    plain = prediction_rows(predict(trained_run, few_images, output=tmp_path / "plain.csv"))
    flipped = prediction_rows(
        predict(trained_run, few_images, output=tmp_path / "flip.csv", tta="flip")
    )
    run = SavedRun(trained_run)
    in_shape = run.sidecar["in_shape"]
    names = [str(c) for c in run.sidecar["class_names"]]
    read = run.image_reader(in_shape)
    x = run.normalize(torch.stack([read(few_images / r["file"]) for r in flipped]))
    net = build_net(run.model_cfg["net"], in_shape, len(names), run.ckpt)
    with torch.inference_mode():
        probs = torch.stack([net(v).softmax(1) for v in tta_views("flip")(x)]).mean(0)
    top_p, top_i = probs.max(1)
    assert [r["predicted"] for r in flipped] == [names[i] for i in top_i.tolist()]
    assert [r["probability"] for r in flipped] == [f"{p:.6f}" for p in top_p.tolist()]
    assert [r["probability"] for r in plain] != [r["probability"] for r in flipped]


@pytest.mark.parametrize(
    ("args", "named"),
    [(["tta=rotate"], "tta='rotate' is not valid"), (["tta="], "tta='' is not valid")],
)
def test_predict_refuses_an_unknown_mode_in_one_line(trained_run, few_images, tmp_path, args,
                                                     named):  # fmt: skip
    res = run_inproc("-m", "experiments.predict", str(trained_run), f"input={few_images}",
                     *args, cwd=tmp_path)  # fmt: skip
    assert_one_line_error(res, named)


@pytest.mark.slow
def test_training_reports_flip_tta_as_eval_does_and_other_tasks_refuse_it(tmp_path, data_dir):
    run = train_cli(tmp_path / "clf", data_dir, "++model.tta=flip", "trainer.max_epochs=1",
                    "logger=none")  # fmt: skip
    trained = read_json(run / "metrics.json")
    assert {"test/tta/acc", "test/tta/balanced_acc", "test/tta/macro_f1"} <= set(trained)
    res = run_inproc("-m", "experiments.eval", str(run), "tta=flip", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    evaluated = read_json(run / "eval_metrics.json")
    for key in ("test/tta/acc", "test/tta/balanced_acc", "test/tta/macro_f1"):
        assert trained[key] == pytest.approx(evaluated[key], abs=1e-6), key

    res = run_inproc("-m", "experiments.train", "++model.tta=rotate", "logger=none",
                     f"paths.data_dir={data_dir}", cwd=tmp_path)  # fmt: skip
    assert_one_line_error(res, "model.tta")
    res = run_inproc("-m", "experiments.train", "experiment=diabetes", "++model.tta=flip",
                     "logger=none", f"paths.data_dir={data_dir}", cwd=tmp_path)  # fmt: skip
    assert_one_line_error(res, "model.tta")

    regression = train_cli(tmp_path / "reg", data_dir, "experiment=diabetes",
                           "trainer.max_epochs=1", "logger=none")  # fmt: skip
    table = tmp_path / "rows.csv"
    table.write_text("age\n1\n")
    res = run_inproc("-m", "experiments.predict", str(regression), f"input={table}", "tta=flip",
                     cwd=tmp_path)  # fmt: skip
    assert_one_line_error(res, "tta=flip", "regression run")
