"""Datasets, transforms and the LightningDataModule."""

from experiments.data.datamodule import ImageDataModule
from experiments.data.datasets import CsvImageDataset, export_digits
from experiments.data.transforms import OneHot

__all__ = ["CsvImageDataset", "ImageDataModule", "OneHot", "export_digits"]
