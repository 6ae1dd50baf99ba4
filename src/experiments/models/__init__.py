"""Plain nets and the LightningModule that trains them."""

from experiments.models.module import ClassificationModule
from experiments.models.nets import CNN, MLP, resnet18

__all__ = ["CNN", "ClassificationModule", "MLP", "resnet18"]
