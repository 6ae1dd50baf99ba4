"""``python -m experiments.export``: a finished run's net as a file to deploy -- ONNX
(checked with onnxruntime) or TorchScript -- with the run's input normalization inside: an
image classifier's (logits per image) or a segmentation run's U-Net (logits per pixel)."""

from __future__ import annotations

import importlib.util
import logging

import numpy as np
import torch

from experiments.callbacks.state_dict_checkpoint import exported
from experiments.errors import UserError, one_line
from experiments.evaluation.saved_run import SavedRun
from experiments.runs.files import read_json_object, write_json

log = logging.getLogger(__name__)


def export(run_dir, fmt: str = "onnx", ckpt: str = "best", opset: int = 18, overrides=()):
    """Write the deployable file (``fmt``: a key of ``runs.layout.EXPORTED``) and return its
    check on the first batch of the test split: ``max_abs_diff`` (the largest |difference|
    of the logits from PyTorch's), and for a classifier the accuracies of both
    (``acc_torch``, ``acc_exported``); for a segmentation run ``pixel_agreement`` (the share
    of pixels whose argmax class is the same in both) and the pixel accuracies against the
    masks (``pixel_acc_torch``, ``pixel_acc_exported``).

    Raises:
        UserError: an opset onnx cannot write, a run without the checkpoint, a missing
            onnxruntime, a net the exporter cannot trace.
    """
    if fmt == "onnx":
        _need("onnx", "onnxscript", "onnxruntime")
    run = SavedRun(run_dir, ckpt, overrides)
    if run.task == "segmentation":  # the U-Net alone: logits (N, classes, H, W)
        net = exported(run.module())
    else:
        run.require_classifier("export")  # a module of your own: its output is its own code's
        net = run.net
    deployable = Normalized(net, run.normalization()).eval()
    split = "test" if run.has_split("test") else "val"
    x, y = next(iter(getattr(run.datamodule, f"{split}_dataloader")()))  # before normalization
    x = x.float()
    target = run.layout.exported(fmt)
    staged = target.with_name(f".{target.name}.tmp")
    with torch.inference_mode():
        expected = deployable(x)
    if fmt == "onnx":
        got = _onnx(deployable, x, staged, opset)
    else:
        scripted = torch.jit.trace(deployable, x)
        torch.jit.save(scripted, staged)
        got = torch.jit.load(staged)(x).detach()
    staged.replace(target)
    check = {
        "file": target.name,
        "batch": int(x.shape[0]),
        "input": [None, *map(int, x.shape[1:])],
        "max_abs_diff": float((got - expected).abs().max()),
        **_agreement(run.task, expected, got, y),
        "ckpt": str(run.ckpt),
        # what the model card names: the checkpoint, its epoch and the split checked on
        "ckpt_name": run.ckpt_name,
        "ckpt_epoch": run.ckpt_epoch,
        "split": split,
    }
    report = read_json_object(run.layout.export_report)
    report[fmt] = check
    write_json(run.layout.export_report, report)
    run.finish()
    return check


def _agreement(task: str, expected, got, y) -> dict:
    """``export``'s agreement keys: per image, or per pixel for segmentation (``(N, K, H, W)``
    logits, ``(N, H, W)`` masks)."""

    def share(a, b) -> float:  # of the images (N,) or pixels (N, H, W) where a equals b
        return float((a == b).float().mean())

    torch_class, exported_class = expected.argmax(1), got.argmax(1)
    if task != "segmentation":
        return {"acc_torch": share(torch_class, y), "acc_exported": share(exported_class, y)}
    return {"pixel_agreement": share(torch_class, exported_class),
            "pixel_acc_torch": share(torch_class, y),
            "pixel_acc_exported": share(exported_class, y)}  # fmt: skip


def _onnx(net, x, path, opset: int):
    # lazy: onnx and onnxruntime are the optional extra experiments[export] (_need checked)
    import onnx
    import onnxruntime  # lazy: as onnx above

    newest = onnx.defs.onnx_opset_version()
    if not 7 <= opset <= newest:
        raise UserError(
            f"opset={opset} is not one onnx {onnx.__version__} writes: use 7 to {newest} "
            "(18 is the default)"
        )
    for name in ("onnxscript", "onnx_ir"):  # their progress notes, one per pass, at INFO
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        torch.onnx.export(
            net,
            (x,),
            str(path),
            input_names=["images"],
            output_names=["logits"],
            dynamic_shapes=({0: torch.export.Dim("batch")},),
            opset_version=int(opset),
            verbose=False,
        )
    except Exception as err:
        path.unlink(missing_ok=True)
        if "opset" in str(err).lower():
            raise UserError(f"opset={opset}: {one_line(err)[:160]} (18 is the default)") from None
        raise UserError(f"torch.onnx cannot export this net: {one_line(err)[:200]}") from None
    written = {o.domain: o.version for o in onnx.load(str(path)).opset_import}.get("", opset)
    if written != opset:  # the exporter falls back to its own opset when it cannot convert
        path.unlink(missing_ok=True)
        raise UserError(
            f"opset={opset}: torch.onnx could not write it (it wrote {written}); use {written}"
        )
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out = session.run(None, {session.get_inputs()[0].name: x.numpy().astype(np.float32)})[0]
    return torch.from_numpy(out)


def _need(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(
            f"format=onnx needs {', '.join(missing)}, not installed here: "
            f"pip install 'experiments[export]' (or pip install {' '.join(missing)})"
        )


class Normalized(torch.nn.Module):
    """``net`` behind the normalization ``stats`` (``(mean, std)`` or None) the run's data
    module applied to every batch."""

    def __init__(self, net: torch.nn.Module, stats) -> None:
        super().__init__()
        self.net = net
        shape = (1, len(stats[0]) if stats else 1, 1, 1)
        self.register_buffer("mean", torch.tensor(stats[0] if stats else [0.0]).view(shape))
        self.register_buffer("std", torch.tensor(stats[1] if stats else [1.0]).view(shape))

    def forward(self, images):  # (N, C, H, W) in [0, 1]
        return self.net((images - self.mean) / self.std)


def command(options: dict, overrides: list[str]) -> None:
    """``python -m experiments.export``'s work, once ``cli`` has parsed its arguments."""
    check = export(
        options["run_dir"], options["format"], options["ckpt"], options["opset"], overrides
    )
    if "pixel_agreement" in check:  # segmentation: per-pixel logits
        said = (
            f"logits per pixel; same class as PyTorch on {check['pixel_agreement']:.4%} of "
            f"pixels, pixel accuracy {check['pixel_acc_exported']:.4f} (PyTorch "
            f"{check['pixel_acc_torch']:.4f})"
        )
    else:
        said = f"accuracy {check['acc_exported']:.4f} (PyTorch {check['acc_torch']:.4f})"
    print(
        f"wrote {options['run_dir']}/{check['file']}: max |difference| from PyTorch "
        f"{check['max_abs_diff']:.2e} on {check['batch']} {check['split']} images, {said}"
    )
