"""``python -m experiments.eval``: test a finished run's checkpoint again, on its own data split.

Examples:
    python -m experiments.eval run_dir=outputs/train/runs/2025-01-01_12-00-00_000000
    python -m experiments.eval run_dir=<run> ckpt=last data.batch_size=256 trainer.accelerator=cpu
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from experiments.config.saved import (
    checkpoint_path,
    load_run_config,
    parse_args,
    read_sidecar,
    resolved,
)
from experiments.console import run_main
from experiments.errors import UserError
from experiments.runs.layout import sidecar_epoch

log = logging.getLogger(__name__)

USAGE = """\
usage: python -m experiments.eval run_dir=<run folder> [ckpt=best|last|<file.pt>] [key=value ...]

Rebuilds the run's data (same split) and model from <run>/.hydra/config.yaml, loads the
weights-only checkpoint (default best), runs the test split and writes
<run>/eval_metrics.json. Other key=value arguments override keys of the run's config,
e.g. data.batch_size=256 trainer.accelerator=cpu (+key=value adds a key)."""


def evaluate(run_dir: str | Path, ckpt: str = "best", overrides: Sequence[str] = ()) -> dict:
    """Test ``ckpt`` of the run in ``run_dir`` and write ``<run_dir>/eval_metrics.json``.

    Args:
        run_dir: a folder made by ``python -m experiments.train``.
        ckpt: ``best``, ``last`` or a path to a weights-only ``.pt`` state_dict.
        overrides: ``key=value`` changes to the run's config (keys must exist).

    Returns:
        The test metrics (``test/acc``, ``test/loss``, ...) as floats.

    Raises:
        UserError: missing run folder or checkpoint, unknown override key, a refused
            ``_target_``, a checkpoint that is not plain weights or does not fit the net.
    """
    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir, overrides)
    ckpt_path = checkpoint_path(run_dir, ckpt)
    data_cfg, model_cfg, trainer_cfg = (resolved(cfg, k) for k in ("data", "model", "trainer"))
    if data_cfg is None or model_cfg is None or "net" not in model_cfg:
        raise UserError(f"{run_dir}/.hydra/config.yaml has no data or model.net section")

    # imported here: torch + lightning cost seconds, argument mistakes should not wait
    import lightning  # noqa: F401  (before route_lightning_logs: the import adds a handler)
    from hydra.utils import instantiate

    from experiments.models.metrics import run_test
    from experiments.runs.files import write_json
    from experiments.runs.weights import load_state_dict_file
    from experiments.utils import resume_gc, route_lightning_logs

    route_lightning_logs()
    start = time.perf_counter()
    datamodule = instantiate(data_cfg)
    datamodule.prepare_data()
    # "fit" makes the same seeded train/val/test split as training did (data.split_seed)
    datamodule.setup("fit")
    from experiments.build import net_for_saved_weights

    net = net_for_saved_weights(model_cfg.net, datamodule.input_shape, datamodule.num_classes)
    load_state_dict_file(net, ckpt_path)
    model = instantiate(
        model_cfg, net=net, optimizer=None, scheduler=None, num_classes=datamodule.num_classes
    )
    trainer = instantiate(
        trainer_cfg or {"_target_": "lightning.pytorch.Trainer"},
        default_root_dir=str(run_dir),
        callbacks=[],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    resume_gc()
    metrics = run_test(trainer, model, datamodule)

    sidecar = read_sidecar(ckpt_path)
    summary = {
        **metrics,
        "ckpt": str(ckpt_path.resolve()),
        "ckpt_epoch": sidecar_epoch(sidecar) if "epoch" in sidecar else None,
        "run_dir": str(run_dir.resolve()),
        "overrides": list(overrides),
        "wall_time_s": round(time.perf_counter() - start, 3),
    }
    write_json(run_dir / "eval_metrics.json", summary)
    _compare_with_training(run_dir, ckpt_path, metrics)
    return metrics


def _compare_with_training(run_dir: Path, ckpt_path: Path, metrics: dict[str, float]) -> None:
    # training tested best.pt: the same file on the same split must give the same number
    if ckpt_path.resolve() != (run_dir / "checkpoints" / "best.pt").resolve():
        return
    try:
        trained = json.loads((run_dir / "metrics.json").read_text()).get("test/acc")
    except (OSError, ValueError):
        return
    if trained is None or "test/acc" not in metrics:
        return
    if trained == metrics["test/acc"]:
        log.info("test/acc matches the run's metrics.json (%.4f)", trained)
    else:
        log.warning(
            "test/acc %.4f differs from the run's metrics.json (%.4f): changed data, "
            "overrides or precision?",
            metrics["test/acc"],
            trained,
        )


def _main(argv: list[str]) -> None:
    options, overrides = parse_args(argv, {"run_dir": None, "ckpt": "best"}, USAGE)
    metrics = evaluate(options["run_dir"], options["ckpt"], overrides)
    for key in sorted(metrics):
        print(f"{key}={metrics[key]:.4f}")
    print(f"wrote {Path(options['run_dir']) / 'eval_metrics.json'}")


def main() -> None:
    run_main(_main, sys.argv[1:])


if __name__ == "__main__":
    main()
