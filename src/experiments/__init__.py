"""experiments: PyTorch Lightning experiments driven by Hydra configs."""

__version__ = "0.1.0"

__all__ = ["find_runs"]


def __getattr__(name: str):
    if name == "find_runs":
        # lazy: `import experiments` stays cheap (no pandas, no torch); find_runs loads on use
        from experiments.analysis.notebook.query import find_runs

        return find_runs
    raise AttributeError(f"module 'experiments' has no attribute {name!r}")
