"""The batch-level data path: splits stacked into one tensor, batches cut by index, shift
and flip augmentation applied to whole batches; the same batches, exact resume, bad input."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate

from experiments.data import store
from experiments.data.loaders import StoreLoader
from experiments.data.store import TensorStore, _Flip, _Shift, batch_augmenter
from experiments.data.transforms import RandomShift
from tests.helpers import (
    REPO,
    assert_same_training_state,
    data_position,
    run_cli,
    run_inproc,
    write_cifar10,
    write_mnist,
)


def _batches(make_cfg, store: str, split: str):
    torch.manual_seed(3)  # the train sampler's seed
    dm = instantiate(make_cfg(f"data.tensor_store={store}").data)
    dm.setup("fit")
    loader = dm.train_dataloader() if split == "train" else dm.val_dataloader()
    return dm, list(loader)


@pytest.mark.parametrize("split", ["train", "val"])
def test_stored_batches_equal_the_sample_by_sample_ones(make_cfg, split):
    dm, cut = _batches(make_cfg, "auto", split)
    _, collated = _batches(make_cfg, "false", split)
    assert isinstance(dm.stores[split], TensorStore)
    subset = getattr(dm, f"{split}_set")  # stacked in one pass from the decoded PNGs
    assert store._whole(subset, subset[0][0].shape) is not None
    loader = dm.train_dataloader() if split == "train" else dm.val_dataloader()
    assert isinstance(loader, StoreLoader) and loader.num_workers == 0
    assert len(cut) == len(collated) > 1
    for (xa, ya), (xb, yb) in zip(cut, collated, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_random_augmentation_without_a_batch_form_keeps_train_sample_by_sample(make_cfg):
    dm = instantiate(make_cfg("augment=strong").data)  # TrivialAugment: per image only
    dm.setup("fit")
    assert set(dm.stores) == {"val", "test"} and dm.augment_batch is None
    dm = instantiate(make_cfg("augment=basic").data)  # shift + flip: whole batches
    dm.setup("fit")
    assert set(dm.stores) == {"train", "val", "test"} and dm.augment_batch is not None


def test_batch_shift_is_a_crop_of_the_padded_image_within_the_padding():
    torch.manual_seed(0)
    x = torch.rand(64, 3, 8, 6)
    shift = _Shift(2, "constant")
    out = shift(x)
    assert out.shape == x.shape
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    offsets = []
    for i in range(len(x)):
        found = [
            (dy, dx)
            for dy in range(5)
            for dx in range(5)
            if torch.equal(out[i], padded[i, :, dy : dy + 8, dx : dx + 6])
        ]
        assert found, f"image {i} is no crop of its padded self"
        offsets.append(found[0])
    assert len(set(offsets)) > 10  # offsets drawn per image, not one per batch
    reflect = _Shift(2, "reflect")(x)
    assert reflect.shape == x.shape and not torch.equal(reflect, x)


def test_batch_flip_mirrors_about_half_of_the_images():
    torch.manual_seed(0)
    x = torch.rand(200, 1, 4, 4)
    out = _Flip(0.5)(x)
    flipped = [torch.equal(o, i.flip(-1)) for o, i in zip(out, x, strict=True)]
    kept = [torch.equal(o, i) for o, i in zip(out, x, strict=True)]
    assert all(f or k for f, k in zip(flipped, kept, strict=True))
    assert 70 < sum(flipped) < 130


def test_batch_augmenter_maps_the_presets():
    from torchvision.transforms import v2

    assert batch_augmenter(None)(torch.ones(2, 1, 3, 3)).equal(torch.ones(2, 1, 3, 3))
    assert batch_augmenter(v2.Compose([RandomShift(4, "reflect"), v2.RandomHorizontalFlip()]))
    assert batch_augmenter(v2.TrivialAugmentWide()) is None
    # symmetric padding has no batch form: the sample path, not a ValueError from setup()
    assert batch_augmenter(RandomShift(4, "symmetric")) is None


@pytest.mark.slow
def test_sigterm_mid_epoch_resume_is_exact_with_batch_augmentation(tmp_path, data_dir):
    # the digits with shifts + flips on whole batches: 1257 train samples, 20 batches an
    # epoch; a SIGTERM after step 30 and a resume end bit-identical to an uninterrupted run
    common = [
        "seed=0", "logger=none", "test=false", "augment=basic", "trainer.max_epochs=3",
        f"paths.data_dir={data_dir}",
    ]  # fmt: skip
    signal = [
        "+callbacks.signal_at._target_=tests.helpers.SignalAt",
        "+callbacks.signal_at.step=30",
    ]
    env = {"PYTHONPATH": str(REPO), "EXPERIMENTS_TRUSTED_MODULES": "tests.helpers"}
    res = run_inproc(
        "-m", "experiments.train", *common, "hydra.run.dir=A", cwd=tmp_path, env_extra=env
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "the augmentation runs on whole batches" in (tmp_path / "A" / "train.log").read_text()
    res = run_cli(  # a process: the SIGTERM ends it
        "-m", "experiments.train", *common, *signal, "hydra.run.dir=B", cwd=tmp_path,
        env_extra=env,
    )  # fmt: skip
    assert res.returncode == 143, res.stderr[-2000:]
    assert data_position(tmp_path / "B/checkpoints/last.ckpt") == {"epoch": 1, "batches": 10}
    res = run_inproc("-m", "experiments.train", "resume=B", cwd=tmp_path, env_extra=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert_same_training_state(
        tmp_path / "A/checkpoints/last.ckpt", tmp_path / "B/checkpoints/last.ckpt"
    )


def test_bad_switch_values_fail_in_one_line(tmp_path, data_dir):
    res = run_inproc(
        "-m", "experiments.train", "data.device_resident=sometimes",
        f"paths.data_dir={data_dir}", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.strip() == (
        "error: data.device_resident='sometimes' is not valid: expected auto, true or false"
    )


@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_torchvision_sets_are_stacked_whole_and_equal_sample_by_sample(tmp_path, name):
    """MNIST's (N, H, W) and CIFAR's (N, H, W, C) arrays go through the transform in chunks
    (the fast path); every sample equals what indexing the split gives."""
    from torchvision.transforms import v2

    from experiments.data import TorchvisionData

    write_cifar10(tmp_path, per_batch=40) if name == "cifar10" else write_mnist(tmp_path)
    transform = v2.Compose(
        [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.4], [0.3])]
    )
    dm = TorchvisionData(
        dataset=name, root=str(tmp_path), eval_transform=transform, train_transform=transform
    )
    dm.setup()
    for split in ("train", "val", "test"):
        subset = getattr(dm, f"{split}_set")
        whole = store._whole(subset, subset[0][0].shape, chunk=7)
        assert whole is not None, split
        x, y = whole
        assert type(x) is torch.Tensor and len(x) == len(subset)
        for i in range(len(subset)):
            xi, yi = subset[i]
            assert torch.equal(x[i], xi) and int(y[i]) == yi
        assert torch.equal(dm.stores[split].x, x)


def test_a_transform_the_whole_array_cannot_take_falls_back_sample_by_sample(tmp_path):
    from torchvision.transforms import v2

    from experiments.data import TorchvisionData

    write_mnist(tmp_path)
    # PIL-only first step: the chunked path fails and the split is stacked one by one
    to_tensor = v2.Compose(
        [v2.Lambda(lambda im: im.convert("L")), v2.ToImage(), v2.ToDtype(torch.float32)]
    )
    dm = TorchvisionData(
        dataset="mnist",
        root=str(tmp_path),
        eval_transform=to_tensor,
        train_transform=to_tensor,
        tensor_store=True,
    )
    dm.setup()
    assert store._whole(dm.val_set, dm.val_set[0][0].shape) is None
    assert torch.equal(dm.stores["val"].x[3], dm.val_set[3][0])


def test_store_loader_shards_like_distributed_sampler_and_resumes_per_rank():
    from experiments.data.samplers import EpochShuffleSampler

    n, bs = 103, 8
    data = TensorStore(torch.arange(n).view(n, 1).float(), torch.arange(n))

    def loader(rank, world, chunk_mb=64.0):
        out = StoreLoader(data, bs, EpochShuffleSampler(n, seed=5), rank=rank, world_size=world)
        out.sampler.set_epoch(2)
        out.chunk_mb = chunk_mb
        return out

    order = EpochShuffleSampler(n, seed=5)
    order.set_epoch(2)
    order = order.order()
    padded = torch.cat([order, order[: 2 * 52 - n]])
    shards = [torch.cat([y for _, y in loader(r, 2)]) for r in (0, 1)]
    assert torch.equal(shards[0], padded[0::2]) and torch.equal(shards[1], padded[1::2])
    assert len(loader(1, 2)) == 7  # ceil(52 / 8) batches on each rank
    # a chunk of one batch (a tiny chunk_mb) hands out the same batches as one chunk
    one = [y for _, y in loader(0, 1)]
    tiny = [y for _, y in loader(0, 1, chunk_mb=1e-9)]
    assert len(one) == 13 and all(torch.equal(a, b) for a, b in zip(one, tiny, strict=True))
    # resumed at epoch 2 after 3 batches: rank 1 goes on with its own 4th batch
    resumed = loader(1, 2)
    resumed.sampler.set_epoch(0)
    resumed.load_state_dict({"epoch": 2, "batches": 3})
    rest = torch.cat([y for _, y in resumed])
    assert torch.equal(rest, shards[1][3 * bs :])
    assert torch.equal(torch.cat([y for _, y in resumed]), shards[1])  # the skip is once
    x, y = next(iter(StoreLoader(data, bs)))  # val/test: views of the store, in order
    assert torch.equal(y, torch.arange(bs)) and x.data_ptr() == data.x.data_ptr()
