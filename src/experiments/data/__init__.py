"""Datasets, transforms and the LightningDataModules (one per source family)."""

from experiments.data.datamodule import (
    CsvData,
    DatasetData,
    DigitsData,
    ImageData,
    ImageDataModule,
    TorchvisionData,
)
from experiments.data.datasets import CsvImageDataset, export_digits
from experiments.data.transforms import OneHot

__all__ = ["CsvData", "CsvImageDataset", "DatasetData", "DigitsData", "ImageData",
           "ImageDataModule", "OneHot", "TorchvisionData", "export_digits"]  # fmt: skip
