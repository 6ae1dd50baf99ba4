"""Data files are read, never run: a crafted pickle in a data folder is refused in one line
and the code it carries never runs (trust round 3)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from experiments.errors import UserError
from tests.helpers import Payload, run_inproc

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
    res = run_inproc(
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


def _csv_run(tmp_path, rows: list[str]):
    from tests.helpers import write_image_folder

    csv_file, image_dir = write_image_folder(tmp_path / "imgs", n=12)
    csv_file.write_text("filename,label\n" + "\n".join(rows) + "\n")
    return run_inproc(
        *("-m", "experiments.train", "data=image_csv", "logger=none", "trainer.max_epochs=1"),
        *(f"data.csv_file={csv_file}", f"data.image_dir={image_dir}", "data.num_workers=0"),
        *("data.val_fraction=0.25", "data.test_fraction=0.25"),
        cwd=tmp_path,
    )


@pytest.mark.slow
def test_csv_label_mistakes_through_the_cli(tmp_path):
    names = [f"img_{i:03d}.png" for i in range(12)]
    # an unquoted comma in a label: one line naming the line, suggesting quotes (it used to
    # merge "fox" rows silently)
    rows = [f"{n},{'fox, grey' if i == 4 else ('cat' if i % 2 else 'dog')}" for i, n in
            enumerate(names)]  # fmt: skip
    res = _csv_run(tmp_path / "a", rows)
    assert res.returncode == 2, res.stderr[-2000:]
    (line,) = [ln for ln in res.stderr.splitlines() if ln.strip()][-1:]
    assert "labels.csv line 6: 3 fields where the header has 2; quote" in line, res.stderr[-1000:]
    assert "Traceback" not in res.stderr
    # one class: one line (it was an IndexError traceback in the metrics)
    res = _csv_run(tmp_path / "b", [f"{n},cat" for n in names])
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert (
        res.stderr.strip()
        .splitlines()[-1]
        .endswith("needs at least 2 classes to classify, found 1 ('cat' on every row)")
    )
    # labels with surrounding spaces: stripped, with a warning naming them; the run trains
    rows = [f'{n},"{" cat" if i % 2 else "dog "}"' for i, n in enumerate(names)]
    res = _csv_run(tmp_path / "c", rows)
    assert res.returncode == 0, res.stderr[-2000:]
    out = res.stdout + res.stderr
    assert "labels with surrounding spaces were stripped: ' cat', 'dog '" in out
    (metrics,) = (tmp_path / "c" / "outputs").rglob("metrics.json")
    assert "test/acc" in metrics.read_text()
