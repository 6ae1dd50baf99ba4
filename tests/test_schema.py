"""Constructor signatures are the config's schema: every key is bound to the imported
signature and checked against the type hint of the argument it sets, before anything is
built, in one line."""

from __future__ import annotations

import shutil

import pytest
from omegaconf import OmegaConf

from experiments.cli.check import precheck
from experiments.config import CONF_DIR, schema
from experiments.errors import UserError
from experiments.runs.layout import RunDir
from experiments.training.pipeline import train
from tests.helpers import REPO, run_cli


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.batch_size=0", "data.batch_size=0 is not valid: expected int >= 1"),
        (
            "data.val_fraction=1.5",
            "val_fraction=1.5 is not valid: expected float >= 0 and < 1",
        ),
        ("data.dataset=cifar100", "dataset='cifar100' is not valid: expected a mapping with"),
        (
            "data.sampler=uniform",
            "sampler='uniform' is not valid: expected shuffle or balanced",
        ),
        (
            "trainer.max_epochs=2.5",
            "max_epochs=2.5 is not valid: expected int >= 1, -1 or null",
        ),
        ("trainer.accelerator=gpux", "expected auto, cpu, gpu, cuda, mps, tpu or a mapping"),
        ("trainer.precision=15", "trainer.precision=15 is not valid: expected 64, 32, 16,"),
        ("optimizer.lr=-1", "optimizer.lr=-1 is not valid: expected float >= 0"),
        ("optimizer.lr=fast", "optimizer.lr='fast' is not valid: expected float >= 0"),
        (
            "model.loss=hinge",
            "loss='hinge' is not valid: expected auto, cross_entropy, focal or logit_adjusted",
        ),
        (
            "model.ema_decay=1.0",
            "ema_decay=1 is not valid: expected float > 0 and < 1 or null",
        ),
        ("model.top_k=0", "model.top_k=0 is not valid: expected int >= 1, auto or null"),
        ("seed=-1", "seed=-1 is not valid: expected int >= 0 and <= 4294967295 or null"),
        ("print_config=yes", "print_config='yes' is not valid: expected true or false"),
        ("optimized_mode=up", "optimized_mode='up' is not valid: expected max or min"),
        ("cv.folds=1", "cv.folds=1 is not valid: expected int >= 2 or null"),
        ("+sweep.retry_faild=true", "did you mean sweep.retry_failed?"),
        ("+trainer.max_epoch=3", "did you mean trainer.max_epochs?"),
        ("+model.net.hidden=[3]", "did you mean model.net.hidden_sizes?"),
        ("scheduler=warmup_cosine", "the warmup must be shorter than the run"),
    ],
)
def test_a_value_the_signature_does_not_admit_is_one_line(make_cfg, override, message):
    extra = ["trainer.max_epochs=1"] if override.startswith("scheduler") else []
    with pytest.raises(UserError) as info:
        schema.check(make_cfg(override, *extra))
    key = override.lstrip("+").split("=")[0]
    assert message in str(info.value) and "\n" not in str(info.value)
    assert str(info.value).startswith(key) or "warmup" in message


@pytest.mark.parametrize(
    "override",
    [
        "trainer.precision=bf16-mixed",
        "trainer.precision=16",
        "trainer.accelerator=cpu",
        "trainer.devices=[0]",
        "trainer.deterministic=warn",
        "trainer.limit_train_batches=0.5",
        "optimizer.momentum=0",  # an int where a float is hinted
        "model.top_k=null",
        "data.cache_transformed=false",
        "seed=null",
    ],
)
def test_values_the_signature_admits_pass(make_cfg, override):
    schema.check(make_cfg(override))


def test_an_argument_added_in_one_file_is_set_and_checked_from_the_command_line(tmp_path, data_dir):
    """Add an argument to MLP's constructor -- the only edit -- and the command line can
    set it (``+key``: the config files need not list it), and a mistyped value or key is
    one line before anything is built."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "src", src, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    nets = src / "experiments" / "models" / "nets.py"
    text = nets.read_text()
    edits = [
        (
            "        dropout: Annotated[float, Ge(0), Lt(1)] = 0.0,\n    ) -> None:\n"
            "        layers: list[nn.Module]",
            "        dropout: Annotated[float, Ge(0), Lt(1)] = 0.0,\n"
            '        activation: Literal["relu", "gelu"] = "relu",'
            "\n    ) -> None:\n        layers: list[nn.Module]",
        ),
        (
            "nn.Linear(width, hidden), nn.ReLU()]",
            'nn.Linear(width, hidden), nn.GELU() if activation == "gelu" else nn.ReLU()]',
        ),
        ("from typing import Annotated\n", "from typing import Annotated, Literal\n"),
    ]  # fmt: skip
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    nets.write_text(text)
    env = {"PYTHONPATH": f"{src}:{REPO}"}
    run = tmp_path / "run"
    # the command line's entry point three times in one process (torch imported once)
    args = ["trainer.max_epochs=1", f"paths.data_dir={data_dir}", f"hydra.run.dir={run}"]
    code = (  # the command line's entry point three times in one process (one torch import)
        "import sys\nfrom experiments.train import main as cli\n"
        "for arg in ['+model.net.activation=gleu', '+model.net.activaton=gelu', "
        f"'+model.net.activation=gelu']:\n    sys.argv = ['train', arg, *{args!r}]\n"
        "    try:\n        cli()\n    except SystemExit as e:\n        print('exit', e.code)\n"
    )
    res = run_cli("-c", code, cwd=tmp_path, env_extra=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split("\n").count("exit 2") == 2, res.stdout[-2000:]
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert errors[0] == "error: model.net.activation='gleu' is not valid: expected relu or gelu"
    assert "did you mean model.net.activation?" in errors[1] and len(errors) == 2
    assert "activation: gelu" in (run / ".hydra" / "config.yaml").read_text()
    assert RunDir(run).best_weights.is_file()


def test_keys_left_for_an_option_that_is_not_chosen_are_one_line(make_cfg):
    # an experiment's body sets scheduler.* while scheduler=none replaced its option: before,
    # training started and died in configure_optimizers ('DictConfig' object is not callable)
    cfg = make_cfg("scheduler=none", "+scheduler.warmup_epochs=1")
    with pytest.raises(UserError) as info:
        schema.check(cfg)
    assert str(info.value).startswith("scheduler has scheduler.warmup_epochs but no _target_")
    schema.check(make_cfg("experiment=finetune", "scheduler=none", "data.csv_file=a.csv",
                          "data.image_dir=imgs"))  # fmt: skip
    # docs/recipes.md's way to switch a speedrun's schedule off: every key dropped is none
    cfg = make_cfg("experiment=speedrun_mnist", "scheduler=none", "~scheduler.warmup_epochs")
    schema.check(cfg)
    assert not cfg.get("scheduler")
    # only an optimizer or a schedule may be empty: an emptied model is no model
    cfg = make_cfg()
    cfg.model = {}
    with pytest.raises(UserError, match="^model is empty: choose a model= option$"):
        schema.check(cfg)


def test_a_sweep_binds_its_first_job_before_any_job_starts(tmp_path, monkeypatch, data_dir):
    monkeypatch.chdir(tmp_path)
    argv = ["-m", "optimizer.lr=-1,0.1", f"paths.data_dir={data_dir}"]
    with pytest.raises(UserError, match=r"^optimizer.lr=-1 is not valid: expected float >= 0"):
        precheck(argv, str(CONF_DIR))
    assert not (tmp_path / "outputs").exists()  # no sweep dir claimed, no job started


def test_train_binds_a_config_the_command_line_never_saw(make_cfg, tmp_path):
    # a later sweep job's values, or an in-process caller: bound before anything is built
    with pytest.raises(UserError, match=r"^model.net.dropout=1.5 is not valid"):
        train(make_cfg("model.net.dropout=1.5"))
    assert not (tmp_path / "run").exists()


def test_a_hint_only_type_checkers_can_read_leaves_the_others_checked(tmp_path, monkeypatch):
    # Lightning's FSDPStrategy hints names imported under TYPE_CHECKING: get_type_hints
    # fails on the whole signature, so each hint is read on its own
    (tmp_path / "made_up_nets.py").write_text(
        "from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from collections import OrderedDict\n"
        "def net(offload: OrderedDict | None = None, width: int = 3):\n    return width\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    net = {"_target_": "made_up_nets.net", "offload": {"a": 1}}
    schema.check(OmegaConf.create({"net": net}))
    with pytest.raises(UserError, match=r"^net.width='wide' is not valid: expected int$"):
        schema.check(OmegaConf.create({"net": {**net, "width": "wide"}}))
    with pytest.raises(UserError, match=r"made_up_nets.net has no argument 'widht'; did you"):
        schema.check(OmegaConf.create({"net": {**net, "widht": 4}}))


def test_a_target_that_does_not_import_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "needs_more.py").write_text("import not_installed_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = OmegaConf.create({"net": {"_target_": "needs_more.Net"}})
    with pytest.raises(UserError) as info:
        schema.check(cfg)
    assert str(info.value) == (
        "net._target_='needs_more.Net': importing needs_more failed: "
        "No module named 'not_installed_anywhere'"
    )
