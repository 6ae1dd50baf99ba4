"""Plain nets and the LightningModule that trains them."""

from experiments.models.backbones import backbone
from experiments.models.module import ClassificationModule
from experiments.models.nets import CNN, MLP, ResNet9, resnet18

__all__ = ["CNN", "ClassificationModule", "MLP", "ResNet9", "backbone", "resnet18"]
