"""Value bounds in the one schema: values a type check admits but that crash late
(``data.image_size=[0,0]``) or run and mislead (``trainer.max_epochs=0`` scores untrained
weights, exit 0) are one line naming the key, the value and the valid range, exit 2, before
anything is built. The bounds live in constructor signatures (``Annotated[..., Ge(1)]``)
and, for Lightning's and torch's arguments, in ``config.schema.REFINED``."""

from __future__ import annotations

import pytest

from experiments.cli.check import precheck
from experiments.config import CONF_DIR, schema
from experiments.errors import UserError
from tests.helpers import run_inproc, write_image_folder

# (override, what the one line says after "<key>=<value> is not valid: expected ")
OUT_OF_RANGE = [
    ("trainer.max_epochs=0", "int >= 1, -1 or null; 0 epochs would test untrained weights"),
    ("trainer.max_epochs=-2", "int >= 1, -1 or null"),
    ("+trainer.max_steps=0", "int >= 1 or -1; 0 steps would test untrained weights"),
    ("trainer.min_epochs=-1", "int >= 0 or null"),
    ("trainer.limit_train_batches=0", "int >= 1, float > 0 and <= 1 or null; 0 batches would"),
    ("trainer.limit_val_batches=0.0", "int >= 1, float > 0 and <= 1 or null"),
    ("trainer.limit_test_batches=1.5", "int >= 1, float > 0 and <= 1 or null"),
    ("trainer.overfit_batches=-1", "int >= 0 or float >= 0 and <= 1"),
    ("trainer.num_sanity_val_steps=-2", "int >= -1 or null"),
    ("trainer.check_val_every_n_epoch=0", "int >= 1 or null"),
    ("trainer.num_nodes=0", "int >= 1"),
    ("trainer.gradient_clip_val=-1", "float >= 0 or null"),
    ("optimizer.momentum=1.0", "float >= 0 and < 1"),
    ("optimizer=adamw optimizer.betas=[0.9,1.5]", "a list of 2 values (each float >= 0 and < 1)"),
    ("optimizer=adamw optimizer.betas=[0.9]", "a list of 2 values (each float >= 0 and < 1)"),
    ("scheduler=step scheduler.step_size=0", "int >= 1"),
    ("scheduler=plateau scheduler.factor=1.0", "float > 0 and < 1"),
    ("scheduler=cosine scheduler.T_max=0", "int >= 1; the cosine period in epochs"),
    ("callbacks.early_stopping.patience=-1", "int >= 0"),
    ("callbacks.model_checkpoint.save_top_k=-2", "int >= -1"),
    ("seed=4294967296", "int >= 0 and <= 4294967295 or null"),
    ("+data.folds=1", "int >= 2 or null"),
    ("+data.fold=-1", "int >= 0"),
    ("model.net.dropout=1.5", "float >= 0 and < 1"),
    ("model=cnn model.net.channels=[0,4]", "a list of int >= 1"),
    ("model=resnet9 model.net.widths=[8,8]", "a list of 4 values (each int >= 1)"),
    ("model=resnet9 model.net.logit_scale=0", "float > 0"),
    # a bound a dataclass DataModule inherits, declared in its base's module
    ("experiment=diabetes data.val_fraction=1.5", "float >= 0 and <= 1"),
    ("experiment=shapes data.test_fraction=-0.5", "float >= 0 and <= 1"),
]
IMAGE_SIZES = [
    ("[0,0]", "[0, 0]"),
    ("[100000,100000]", "[100000, 100000]"),
    ("[64]", "[64]"),
    ("64", "64"),
]
IMAGE_SIZE_RANGE = "a list of 2 values (each int >= 1 and <= 4096) or null; each image is resized"


def _key_and_value(override: str) -> tuple[str, str]:
    key, value = override.split()[-1].lstrip("+").split("=", 1)
    return key, value


@pytest.mark.parametrize(("override", "expected"), OUT_OF_RANGE)
def test_a_value_out_of_range_is_one_line_before_anything_is_built(make_cfg, override, expected):
    with pytest.raises(UserError) as info:
        schema.check(make_cfg(*override.split()))
    key, _ = _key_and_value(override)
    message = str(info.value)
    assert message.startswith(f"{key}=") and "\n" not in message, message
    assert f"is not valid: expected {expected}" in message, message


@pytest.mark.parametrize(("given", "shown"), IMAGE_SIZES)
def test_an_image_size_outside_1_to_4096_is_one_line(make_cfg, tmp_path, given, shown):
    csv_file, image_dir = write_image_folder(tmp_path / "imgs", n=8)
    cfg = make_cfg(
        "data=image_csv",
        f"data.csv_file={csv_file}",
        f"data.image_dir={image_dir}",
        f"data.image_size={given}",
    )
    with pytest.raises(UserError) as info:
        schema.check(cfg)
    assert str(info.value).startswith(f"data.image_size={shown} is not valid: expected ")
    assert IMAGE_SIZE_RANGE in str(info.value)


@pytest.mark.parametrize(
    "override",
    [
        "trainer.max_epochs=-1 +trainer.max_steps=5",  # Lightning's "no limit", with a stop
        "trainer.limit_train_batches=1",
        "trainer.limit_val_batches=1.0",
        "trainer.overfit_batches=0.0",
        "trainer.num_sanity_val_steps=-1",
        "callbacks.model_checkpoint.save_top_k=-1",
        "optimizer.lr=0.0",  # asked for on purpose: frozen weights
        "seed=4294967295",
        "optimizer=adamw optimizer.betas=[0.5,0.99]",
    ],
)
def test_values_at_the_edges_of_the_ranges_pass(make_cfg, override):
    schema.check(make_cfg(*override.split()))


def test_the_image_size_bound_admits_every_size_in_range(make_cfg, tmp_path):
    csv_file, image_dir = write_image_folder(tmp_path / "imgs", n=8)
    for size in ("[1,1]", "[96,96]", "[4096,4096]", "null"):
        schema.check(
            make_cfg(
                "data=image_csv",
                f"data.csv_file={csv_file}",
                f"data.image_dir={image_dir}",
                f"data.image_size={size}",
            )
        )


CLI_CASES = [
    ("trainer.max_epochs=0", "0 epochs would test untrained weights"),
    ("+trainer.max_steps=0", "0 steps would test untrained weights"),
    ("trainer.limit_train_batches=0", "0 batches would train nothing"),
    ("data.batch_size=abc", "expected int >= 1"),
    ("data.batch_size=-4", "expected int >= 1"),
    ("scheduler=plateau scheduler.factor=2", "expected float > 0 and < 1"),
]


@pytest.mark.parametrize(("override", "reason"), CLI_CASES)
def test_the_command_line_check_refuses_out_of_range_values(
    tmp_path, monkeypatch, data_dir, override, reason
):
    # the check the command line runs before Hydra makes a run dir (in this process: the
    # exit code and stderr of one such refusal are the next test's)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as info:
        precheck([f"paths.data_dir={data_dir}", *override.split()], str(CONF_DIR))
    key, value = _key_and_value(override)
    shown = f"'{value}'" if value == "abc" else value
    message = str(info.value)
    assert message.startswith(f"{key}={shown} is not valid: expected ") and "\n" not in message
    assert reason in message
    assert not (tmp_path / "outputs").exists()  # refused before a run dir was made


def test_an_out_of_range_value_on_the_command_line_is_one_line_exit_2(tmp_path, data_dir):
    csv_file, image_dir = write_image_folder(tmp_path / "imgs", n=8)
    res = run_inproc(
        *("-m", "experiments.train", "data=image_csv", f"data.csv_file={csv_file}"),
        *(f"data.image_dir={image_dir}", "data.image_size=[0,0]", f"paths.data_dir={data_dir}"),
        cwd=tmp_path,
    )
    assert res.returncode == 2, res.stderr[-2000:]
    expected = f"error: data.image_size=[0, 0] is not valid: expected {IMAGE_SIZE_RANGE}"
    assert res.stderr.strip() == expected + " to it in memory (4096x4096 RGB is 200 MB as float32)"
    assert not (tmp_path / "outputs").exists()  # refused before a run dir was made
