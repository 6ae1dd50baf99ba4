"""Data files are read, never run: a crafted pickle in a data folder is refused in one line
and the code it carries never runs (trust round 3)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from experiments.errors import UserError
from tests.conftest import run_cli
from tests.helpers import Payload

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def write_cifar(root, per_batch: int = 20, payload_at=None) -> None:
    """A CIFAR-10 folder in the python layout (pickled dicts, as the real files are)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        entry = {
            "batch_label": name,
            "labels": [i % 10 for i in range(per_batch)],
            "data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            "filenames": [f"{name}_{i}.png" for i in range(per_batch)],
        }
        if name == payload_at:
            entry["labels"] = Payload(str(root / "pwned"))
        with open(folder / name, "wb") as f:
            pickle.dump(entry, f, protocol=2)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": CLASSES, "num_vis": 3072}, f, protocol=2)


def _datamodule(root):
    import torch
    from torchvision.transforms import v2

    from experiments.data import ImageDataModule

    tensors = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])
    dm = ImageDataModule(
        dataset="cifar10", root=str(root), batch_size=8, train_transform=tensors,
        eval_transform=tensors,
    )  # fmt: skip
    dm.setup("fit")
    return dm


def test_cifar_batches_load_as_data(tmp_path):
    write_cifar(tmp_path)
    dm = _datamodule(tmp_path)
    assert dm.class_names == CLASSES and dm.input_shape == (3, 32, 32)
    assert len(dm.train_set) + len(dm.val_set) == 100 and len(dm.test_set) == 20
    from experiments.data.sources import SafeCIFAR10

    pixels = SafeCIFAR10(str(tmp_path), train=False).data
    assert pixels.shape == (20, 32, 32, 3) and pixels.dtype == np.uint8


def test_a_crafted_cifar_batch_is_refused_and_never_runs(tmp_path):
    write_cifar(tmp_path, payload_at="data_batch_1")
    with pytest.raises(UserError, match=r"data_batch_1: refused: not a plain data pickle"):
        _datamodule(tmp_path)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.slow
def test_a_crafted_cifar_batch_through_the_cli_is_one_line_and_never_runs(tmp_path):
    write_cifar(tmp_path / "data", payload_at="data_batch_3")
    res = run_cli(
        *("-m", "experiments.train", "data=cifar10", "model=mlp", "logger=none"),
        *(f"paths.data_dir={tmp_path / 'data'}", "data.num_workers=0", "trainer.max_epochs=1"),
        cwd=tmp_path,
    )
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2, res.stderr[-2000:]
    assert lines[-1].startswith("error: ") and "data_batch_3: refused" in lines[-1], lines[-3:]
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "data" / "pwned").exists()


def test_safe_pickle_refuses_object_arrays_and_any_callable(tmp_path):
    from experiments.data import safe_pickle

    assert safe_pickle.loads(pickle.dumps({"a": [1, "x", b"y"], "b": np.arange(3)}), "ok")["a"]
    with pytest.raises(UserError, match="array of Python objects"):
        safe_pickle.loads(pickle.dumps(np.array([1, "x"], dtype=object)), "objs")
    for evil in (Payload(str(tmp_path / "pwned")), np.random.default_rng(0)):
        with pytest.raises(UserError, match="evil.pkl: refused"):
            safe_pickle.loads(pickle.dumps(evil), "evil.pkl")
    assert not (tmp_path / "pwned").exists()
