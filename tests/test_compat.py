"""Each use of a library's private API (experiments.compat), pinned: when an upgrade changes
one, these fail and say which, before a run does."""

from __future__ import annotations

import inspect


def test_fork_launcher_is_made_signal_safe():
    import lightning as L

    from experiments.compat.lightning import _SignalSafeLauncher, signal_safe_workers

    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp_fork", logger=False, enable_progress_bar=False
    )
    assert hasattr(trainer.strategy, "_launcher"), "Lightning: Strategy._launcher is gone"
    signal_safe_workers(trainer)
    assert type(trainer.strategy._launcher) is _SignalSafeLauncher, (
        "Lightning's ddp_fork launcher is no longer _MultiProcessingLauncher: "
        "compat.signal_safe_workers leaves it as it is (workers would hang on SIGTERM)"
    )
    params = list(inspect.signature(_SignalSafeLauncher.__mro__[1]._wrapping_function).parameters)
    assert params[:4] == ["self", "process_idx", "trainer", "function"], (
        f"Lightning: _MultiProcessingLauncher._wrapping_function takes {params} now"
    )


def test_hydra_job_outcome_and_basic_launcher():
    from hydra.core.utils import JobReturn, JobStatus

    from experiments.compat.hydra import is_basic_launcher, job_outcome

    failed = JobReturn()
    failed.status, failed.return_value = JobStatus.FAILED, ValueError("boom")
    assert job_outcome(failed)[0] is True and str(job_outcome(failed)[1]) == "boom", (
        "Hydra: JobReturn no longer keeps a failed job's exception in _return_value"
    )
    done = JobReturn()
    done.status, done.return_value = JobStatus.COMPLETED, 0.5
    assert job_outcome(done) == (False, 0.5)
    from hydra._internal.core_plugins.basic_launcher import BasicLauncher

    assert is_basic_launcher(BasicLauncher()) and not is_basic_launcher(object())


def test_hydra_composer_composes_the_whole_config():
    from experiments.compat.hydra import Composer, is_multirun, task_view
    from experiments.config import CONF_DIR

    full = Composer(str(CONF_DIR), "train").compose(["model=cnn"])
    assert full.hydra.job.name and not is_multirun(full), "Hydra: compose_config changed"
    assert "hydra" not in task_view(full) and task_view(full).model.net._target_


def test_lightning_trainer_step_and_experiment_handles(tmp_path):
    import lightning as L
    import torch

    from experiments.compat.lightning import (
        AppendingCSVLogger,
        attached_trainer,
        batches_processed,
        close_experiment,
        epochs_processed,
        logger_step,
        opened_experiment,
    )

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Progress(L.Callback):
        seen: list = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.seen.append((trainer.current_epoch, batch_idx,
                              epochs_processed(trainer), batches_processed(trainer)))  # fmt: skip

    module = Tiny()
    assert attached_trainer(module) is None, "Lightning: LightningModule._trainer changed"
    logger = AppendingCSVLogger(tmp_path)
    assert opened_experiment(logger) is None
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(6, 2)), 2)
    trainer = L.Trainer(max_steps=5, logger=logger, callbacks=[Progress()],
                        enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False)  # fmt: skip
    trainer.fit(module, data)
    assert attached_trainer(module) is trainer
    assert logger_step(trainer) == trainer.global_step == 5, "Lightning: the logger step moved"
    # 3 batches an epoch: what a mid-epoch checkpoint's loader state and the sampler read
    expected = [(e, b, e, b + 1) for e, b in ((0, 0), (0, 1), (0, 2), (1, 0), (1, 1))]
    assert Progress.seen == expected, (
        f"Lightning: the fit loop's epoch_progress / batch_progress counts moved: {Progress.seen}"
    )
    assert opened_experiment(logger) is not None and close_experiment(logger) is not None
    assert opened_experiment(logger) is None


def test_optuna_trial_by_number(tmp_path):
    import optuna

    from experiments.compat.optuna import trial_by_number

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    asked = [study.ask() for _ in range(2)]
    trial = trial_by_number(study, 1)
    assert trial._trial_id == asked[1]._trial_id, "Optuna: the storage's trial lookup changed"
    trial.report(0.5, step=0)
    assert study.trials[1].intermediate_values == {0: 0.5}


def test_lightning_mlflow_run_opened(tmp_path):
    from lightning.pytorch.loggers import MLFlowLogger

    from experiments.compat.lightning import mlflow_run_opened

    logger = MLFlowLogger(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert mlflow_run_opened(logger) is False, "Lightning: MLFlowLogger._initialized changed"
    assert logger.run_id  # the public handle starts the run
    assert mlflow_run_opened(logger) is True, "Lightning: MLFlowLogger._initialized changed"


def test_torch_dynamo_error_switch_and_graph_breaks():
    import torch

    from experiments.compat.torch import clear_graph_breaks, graph_breaks, suppress_dynamo_errors

    before = suppress_dynamo_errors(True)
    try:
        assert suppress_dynamo_errors(True) is True, "torch: _dynamo.config.suppress_errors moved"
    finally:
        suppress_dynamo_errors(before)

    def branchy(x):
        if x.sum() > 0:  # data-dependent: Dynamo breaks the graph here
            return x * 2
        return x - 1

    clear_graph_breaks()
    assert graph_breaks() == {}
    torch.compile(branchy, backend="eager")(torch.ones(3))
    reasons = graph_breaks()
    assert sum(reasons.values()) >= 1, (
        f"torch: Dynamo no longer counts graph breaks in _dynamo.utils.counters {reasons}"
    )
    clear_graph_breaks()
    assert graph_breaks() == {}


def test_torch_batch_norm_base():
    from torch import nn

    from experiments.compat.torch import is_batch_norm

    norms = [nn.BatchNorm1d(2), nn.BatchNorm2d(2), nn.BatchNorm3d(2), nn.SyncBatchNorm(2),
             nn.LazyBatchNorm2d()]  # fmt: skip
    assert all(is_batch_norm(m) for m in norms), "torch: _BatchNorm is no longer their base"
    assert not any(is_batch_norm(m) for m in (nn.LayerNorm(2), nn.GroupNorm(1, 2), nn.Linear(1, 1)))
