"""``python -m experiments.predict``: a finished run's checkpoint on new inputs, with what the
output means for its task: a class per image (classification), a number per CSV row
(regression), a mask PNG per image (segmentation)."""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Sequence
from pathlib import Path

import torch

from experiments.console import resume_gc
from experiments.data.datasets import leads_outside
from experiments.data.tabular import read_features
from experiments.errors import UserError
from experiments.evaluation.saved_run import SavedRun
from experiments.models.tta import TTA, tta_views
from experiments.recorded.folder import check_output
from experiments.recorded.saved_net import build_net
from experiments.runs.files import atomic_write, write_text
from experiments.runs.layout import sidecar_of

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
COLUMNS = ("file", "predicted", "probability")
ROW_COLUMNS = ("row", "predicted")  # regression: one value per data row, in file order
MASK_COLUMNS = ("file", "mask", "classes")  # segmentation: the PNG written, classes in it


def predict(
    run_dir: str | Path,
    input: str | Path,
    ckpt: str = "best",
    output: str | Path | None = None,
    image_dir: str | Path | None = None,
    device: str = "auto",
    overrides: Sequence[str] = (),
    tta: str = "none",
) -> Path:
    """Predict every input with the run's checkpoint and write a CSV (returns its path); what
    it holds depends on the run's task (``SavedRun.task``):

    * classification: ``file,predicted,probability`` per image;
    * regression: ``row,predicted`` per data row of the CSV ``input`` (its columns named by
      the checkpoint sidecar's ``feature_names``), in the target's units, in file order;
    * segmentation: ``file,mask,classes`` per image, and the mask, a PNG of class indices
      at the image's own size, under ``<output stem>_masks/`` beside the CSV.

    A run of a module of your own is refused in one line (its output is its own code's).

    Images are read as the run's eval data reads them (``SavedRun.image_reader``), at the
    checkpoint's sidecar ``in_shape``; probabilities are temperature-scaled when
    ``experiments.calibrate`` fitted a temperature for this checkpoint.

    Args:
        run_dir: a folder made by ``python -m experiments.train``.
        input: a folder of images, or a CSV with a ``filename`` column; for a regression
            run, a CSV with the feature columns.
        ckpt, overrides: the checkpoint and ``key=value`` changes to the run's config, as
            ``SavedRun`` takes them.
        output: the CSV to write; None means ``<run_dir>/predictions.csv``.
        image_dir: folder the CSV's file names are relative to (default: the CSV's folder).
        device: ``auto`` (CUDA when available), ``cpu`` or ``cuda``.
        tta: ``flip`` or ``flip_translate`` (a classifier only): each image's probabilities
            are the mean softmax over its views (``models.tta.tta_views``), as eval's
            ``test/tta/*``; ``none`` predicts from the image alone.

    Raises:
        UserError: missing run, checkpoint or images, an empty folder, an unreadable image.
    """
    run_dir = Path(run_dir)
    if device not in ("auto", "cpu", "cuda"):
        raise UserError(f"device={device!r} is not valid; use auto, cpu or cuda")
    if tta not in TTA:
        raise UserError(f"tta={tta!r} is not valid; use one of {', '.join(TTA)}")
    run = SavedRun(run_dir, ckpt, overrides)  # checks everything it will build, builds nothing
    if tta != "none" and run.task != "classification":
        if run.task == "own":
            run.require_classifier("tta")  # names the module and what works for it
        raise UserError(f"tta={tta} averages an image classifier's views of an image; "
                        f"{run.path} is a {run.task} run: predict it without tta=")  # fmt: skip
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if run.task == "regression":
        if image_dir:
            raise UserError("image_dir= names a folder of images; a regression run reads a CSV")
        return _predict_rows(run, Path(input), output, device)
    if run.task != "segmentation":
        run.require_classifier("predict")  # a module of your own: its output is its own code's
    follow_symlinks = run.data_cfg.get("follow_symlinks") is True  # the run's own CSV rule
    names, paths = _list_inputs(Path(input), image_dir, follow_symlinks)
    output = check_output(Path(output) if output else run.layout.predictions, run_dir)
    if run.task == "segmentation":
        return _predict_masks(run, names, paths, output, device)
    in_shape, class_names = _shape_and_classes(run)
    temperature = run.temperature or 1.0  # experiments.calibrate's, for this checkpoint
    net = build_net(run.model_cfg["net"], in_shape, len(class_names), run.ckpt).to(device)
    views = tta_views(tta) or (lambda x: [x])
    rows = []
    for chunk, logits in _logits(run, net, paths, in_shape, device, views):  # (V, B, classes)
        probs = torch.softmax(logits / temperature, dim=-1).mean(0)  # (B, classes)
        top_p, top_i = probs.max(dim=1)
        for name, p, i in zip(names[chunk], top_p.tolist(), top_i.tolist(), strict=True):
            rows.append((name, class_names[i], f"{p:.6f}"))
    return _write(run, output, COLUMNS, rows)


def _write(run: SavedRun, output: Path, columns: Sequence[str], rows: list) -> Path:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    write_text(output, text.getvalue())
    run.refresh_manifest()  # a predictions file written into the run is the run's from now on
    log.info("%d predictions with %s -> %s", len(rows), run.ckpt, output)
    return output


def _predict_rows(run: SavedRun, input: Path, output: Path | None, device: str) -> Path:
    """A regression run: one value per data row of the CSV ``input``, from the columns the
    run trained on (by name, in the sidecar's order), in the target's own units (the
    standardization the weights carry is undone by ``RegressionModule.predict_rows``)."""
    if input.is_dir() or input.suffix.lower() != ".csv":
        raise UserError(
            f"input={input}: a regression run predicts from a CSV with a header row and the "
            f"feature columns {', '.join(run.feature_names[:10])}"
        )
    output = check_output(Path(output) if output else run.layout.predictions, run.path)
    rows = read_features(str(input), run.feature_names)  # (N, F), one line per refusal
    module = run.module().to(device)
    values = module.predict_rows(rows).tolist()  # (N,)
    return _write(run, output, ROW_COLUMNS, [(i, f"{v:.9g}") for i, v in enumerate(values, 1)])


def _predict_masks(run: SavedRun, names: list, paths: list, output: Path, device: str) -> Path:
    """A segmentation run: each image read as its eval data reads images (at the training
    size), its per-pixel logits resized back to the image's own size (bilinear) and their
    argmax written as an 8-bit PNG of class indices."""
    from PIL import Image  # lazy: only a segmentation run writes images

    masks_dir = output.with_name(f"{output.stem}_masks")
    if masks_dir.exists() and not masks_dir.is_dir():
        raise UserError(f"{masks_dir} exists and is not a folder: the masks go there")
    targets = [Path(n).with_suffix(".png") for n in names]
    seen: dict[Path, str] = {}
    for name, target in zip(names, targets, strict=True):
        if seen.setdefault(target, name) != name:
            raise UserError(
                f"{seen[target]} and {name} would both write {masks_dir / target}; rename one"
            )
    in_shape, class_names = _shape_and_classes(run)
    if len(class_names) > 256:
        raise UserError(f"{len(class_names)} classes do not fit a mask PNG of 8-bit indices")
    net = run.module().to(device)
    rows = []
    for chunk, logits in _logits(run, net, paths, in_shape, device):  # (B, K, H, W)
        for name, path, target, one in zip(
            names[chunk], paths[chunk], targets[chunk], logits, strict=True
        ):
            with Image.open(path) as image:  # decoded whole by the reader already
                width, height = image.size
            if (height, width) != tuple(one.shape[1:]):
                one = torch.nn.functional.interpolate(
                    one[None], size=(height, width), mode="bilinear", align_corners=False
                )[0]
            mask = one.argmax(0).to(torch.uint8).cpu().numpy()  # (H, W)
            written = masks_dir / target  # (H, W) uint8: an 8-bit (mode L) PNG
            atomic_write(written, lambda f, mask=mask: Image.fromarray(mask).save(f, format="PNG"))
            present = [class_names[i] for i in sorted(set(mask.flat))]
            rows.append((name, str(written), ";".join(present)))
    return _write(run, output, MASK_COLUMNS, rows)


def _logits(run: SavedRun, net, paths: list[Path], in_shape, device, views=None):
    """``(slice of paths, float logits)`` batch by batch, each image read and normalized as
    the run's eval data; with ``views`` (a batch to a list of batches, ``tta_views``) the
    logits of each view stacked: ``(V, B, ...)``."""
    read = run.image_reader(in_shape)
    run.input_stats  # noqa: B018  (a missing statistics file: one line before any image is read)
    resume_gc()
    batch_size = int(run.data_cfg.get("batch_size") or 64)  # as the run saved it, or overridden
    with torch.inference_mode():
        for start in range(0, len(paths), batch_size):
            chunk = slice(start, start + batch_size)
            x = run.normalize(torch.stack([read(p) for p in paths[chunk]])).to(device)  # (B,C,H,W)
            if views is None:
                yield chunk, net(x).float()
            else:
                yield chunk, torch.stack([net(v).float() for v in views(x)])


def _list_inputs(
    input: Path, image_dir: str | Path | None, follow_symlinks: bool = False
) -> tuple[list[str], list[Path]]:
    """(names to report, files to read) from a folder of images or a CSV index.

    A CSV's rows follow the rule the run's own CSV rows follow (``leads_outside``): a file
    name is a relative path inside the image folder, and a symlink out of it is refused
    unless the run reads through them (``data.follow_symlinks``). A file may be listed twice
    (it is predicted twice).
    """
    if input.is_dir():
        files = sorted(
            p for p in input.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
        )
        if not files:
            raise UserError(
                f"no images in {input} (looked for {' '.join(IMAGE_SUFFIXES)}, not in subfolders)"
            )
        return [p.name for p in files], files
    if not input.is_file():
        raise UserError(f"input not found: {input} (give a folder of images or a CSV file)")
    if input.suffix.lower() != ".csv":
        raise UserError(f"input {input} is neither a folder nor a .csv file")
    base = Path(image_dir) if image_dir else input.parent
    if not base.is_dir():
        raise UserError(f"image_dir not found: {base}")
    try:
        with open(input, newline="") as f:
            reader = csv.DictReader(f)
            fields = [c.strip() for c in reader.fieldnames or []]
            if "filename" not in fields:
                raise UserError(f"{input}: header must have a 'filename' column, found {fields}")
            reader.fieldnames = fields
            names = [(rec.get("filename") or "").strip() for rec in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise UserError(f"cannot read {input}: {err}") from None
    root, dirs = base.resolve(), {}  # one resolve per folder, shared by every row
    for row, name in enumerate(names, start=2):
        if not name:
            raise UserError(f"{input} row {row}: empty filename")
        if "\0" in name:
            raise UserError(f"{input} row {row}: file name {name[:200]!r} holds a NUL byte")
        if leads_outside(base, name, follow_symlinks=True) is not None:  # absolute, or ../
            raise UserError(
                f"{input} row {row}: file name {name[:200]!r} leads outside {base}; file "
                f"names must be relative paths inside the image folder (image_dir=, by "
                f"default the CSV's folder)"
            )
        target = leads_outside(base, name, follow_symlinks, root=root, dirs=dirs)
        if target is not None:
            raise UserError(
                f"{input} row {row}: {name[:200]!r} leads through a symlink to {target}, "
                f"outside {base}; move the file inside or set (+)data.follow_symlinks=true"
            )
        if not (base / name).is_file():
            raise UserError(f"{input} row {row}: image {base / name} does not exist")
    if not names:
        raise UserError(f"{input}: no rows after the header")
    return names, [base / n for n in names]


def _shape_and_classes(run: SavedRun) -> tuple[list[int], list[str]]:
    sidecar = run.sidecar  # in_shape and class_names checked for type and range
    in_shape = list(sidecar.get("in_shape") or [])
    class_names = [str(c) for c in sidecar.get("class_names") or []]
    if not in_shape or not class_names:
        # no sidecar (a .pt from elsewhere): the training data tells shape and class names
        log.info("no in_shape/class_names sidecar next to the checkpoint: reading the run's data")
        in_shape, class_names = list(run.datamodule.input_shape), list(run.datamodule.class_names)
    if len(in_shape) != 3 or in_shape[0] not in (1, 3):
        raise UserError(
            f"{sidecar_of(run.ckpt)}: in_shape={in_shape}; predict reads images, "
            f"so it needs [C, H, W] with C = 1 (grayscale) or 3 (RGB)"
        )
    return [int(v) for v in in_shape], class_names


def command(options: dict, overrides: list[str]) -> None:
    """``python -m experiments.predict``'s work, once ``cli`` has parsed its arguments (its
    options are ``predict``'s arguments; an empty output= or image_dir= is not given)."""
    print(preview(predict(**options, overrides=overrides)))


def preview(path: Path, first: int = 5) -> str:
    """The first ``first`` predictions of the CSV at ``path`` as a small table, and where
    the rest are."""
    with open(path, newline="") as f:
        header, *rows = list(csv.reader(f))
    shown = rows[:first]  # a number per row, or a mask per image: as written
    if tuple(header) == COLUMNS:  # a class and its probability, to 3 places
        header = [header[0], f"{'predicted':<12} probability"]
        shown = [[r[0], f"{r[1]:<12} {float(r[2]):.3f}"] for r in shown]
    width = max([len(r[0]) for r in shown] + [len(header[0])])
    lines = [f"{r[0]:<{width}}  {'  '.join(r[1:])}" for r in [header, *shown]]
    more = f" ({len(rows) - first} more)" if len(rows) > first else ""
    return "\n".join([*lines, f"{len(rows)} predictions{more}: {path}"])
