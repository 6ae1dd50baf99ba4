"""experiments: PyTorch Lightning experiments driven by Hydra configs."""

__version__ = "0.1.0"
