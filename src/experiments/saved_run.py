"""A finished run opened again: its config (with overrides), its data split as it trained,
its net with the saved weights. What eval, calibrate and export start from."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from experiments.config.saved import checkpoint_path, load_run_config, read_sidecar, resolved
from experiments.errors import UserError
from experiments.runs.layout import RunDir

if TYPE_CHECKING:
    import torch


class SavedRun:
    """A run folder made by ``python -m experiments.train``.

    Args:
        run_dir: the folder.
        ckpt: ``best``, ``last`` or a weights-only ``.pt`` file.
        overrides: ``key=value`` changes to the saved config (keys must exist; ``+key``
            adds one).

    Raises:
        UserError: no such run folder or checkpoint, an unknown override key, a refused
            ``_target_``, a config without data or model.net.
    """

    def __init__(self, run_dir: str | Path, ckpt: str = "best", overrides: Sequence[str] = ()):
        self.path = Path(run_dir)
        self.layout = RunDir(self.path)
        self.cfg = load_run_config(self.path, overrides)
        self.ckpt = checkpoint_path(self.path, ckpt)
        self.data_cfg, self.model_cfg, self.trainer_cfg = (
            resolved(self.cfg, k) for k in ("data", "model", "trainer")
        )
        if self.data_cfg is None or self.model_cfg is None or "net" not in self.model_cfg:
            raise UserError(f"{self.layout.saved_config} has no data or model.net section")

    @property
    def sidecar(self) -> dict:
        """What was recorded with the checkpoint (epoch, metric, value), or {}."""
        return read_sidecar(self.ckpt)

    @cached_property
    def datamodule(self):
        """The data as it trained: the same seeded train/val/test split, the same statistics."""
        from hydra.utils import instantiate

        datamodule = instantiate(self.data_cfg)
        datamodule.prepare_data()
        datamodule.setup("fit")
        return datamodule

    @cached_property
    def net(self) -> torch.nn.Module:
        """The plain net with the checkpoint's weights, in eval mode."""
        from experiments.build import net_for_saved_weights
        from experiments.runs.weights import load_state_dict_file

        dm = self.datamodule
        net = net_for_saved_weights(self.model_cfg.net, dm.input_shape, dm.num_classes)
        load_state_dict_file(net, self.ckpt)
        return net.eval()

    def module(self):
        """The LightningModule around ``net`` (no optimizer), for ``trainer.test``."""
        from hydra.utils import instantiate

        from experiments.build import model_extras

        return instantiate(
            self.model_cfg,
            net=self.net,
            optimizer=None,
            scheduler=None,
            num_classes=self.datamodule.num_classes,
            **model_extras(self.model_cfg, self.datamodule),
        )

    def trainer(self):
        """A Trainer as the run configured it, minus logging, checkpoints and callbacks."""
        from hydra.utils import instantiate

        return instantiate(
            self.trainer_cfg or {"_target_": "lightning.pytorch.Trainer"},
            default_root_dir=str(self.path),
            callbacks=[],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )

    def has_split(self, split: str) -> bool:
        return len(getattr(self.datamodule, f"{split}_set", None) or ()) > 0

    def first_batch(self, split: str = "test") -> tuple[torch.Tensor, torch.Tensor]:
        """The split's first batch as the net's input before normalization (``(B, C, H, W)``
        as the eval transform gives it) and its labels."""
        x, y = next(iter(getattr(self.datamodule, f"{split}_dataloader")()))
        return x, y

    def logits(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The net's logits ``(N, K)`` and the labels ``(N,)`` of a whole split, on the CPU."""
        import torch

        if not self.has_split(split):
            raise UserError(f"{self.path}: the run has no {split} split")
        dm, net = self.datamodule, self.net
        outs, labels = [], []
        with torch.inference_mode():
            for batch in getattr(dm, f"{split}_dataloader")():
                x, y = dm.on_after_batch_transfer(batch, 0)  # normalized as in training
                outs.append(net(x).float())
                labels.append(y)
        return torch.cat(outs), torch.cat(labels)

    def normalization(self) -> tuple[list[float], list[float]] | None:
        """``(mean, std)`` the data module normalizes batches with, or None."""
        stats = getattr(self.datamodule, "stats", None)
        return (list(stats[0]), list(stats[1])) if stats is not None else None
