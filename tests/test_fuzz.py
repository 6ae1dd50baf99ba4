"""Property-based fuzzing of every reader of a run folder and of user data (trust round 4).

Each reader is fed generated malformed and hostile inputs -- mutated copies of the files of
one real tiny run (its saved config, saved overrides, checkpoint sidecar, metrics.json,
data_stats.json, job.json, env.json), CSV indexes of an image folder, PNG headers, and raw
text for ``experiments.runs.files`` -- and must either return or raise
``experiments.errors.UserError`` with one line. Never another exception, never a hang
(each example is cut off after ``EXPERIMENTS_FUZZ_TIMEOUT`` seconds and fails), never a
marker file (the inputs carry ``_target_``s of functions that would create it, YAML
``!!python`` tags, ``${oc...}`` interpolations, alias bombs, huge numbers, deep nesting,
control characters and bytes that are not UTF-8).

Budget: ``EXPERIMENTS_FUZZ_EXAMPLES`` examples per reader (default 12: the file runs in
about 30 s on 2 cores, in ``make test``). Generation is derandomized, so CI sees the same
inputs on every run; a longer budget explores further::

    EXPERIMENTS_FUZZ_EXAMPLES=1000 .venv/bin/python -m pytest -n 0 tests/test_fuzz.py

A failure prints the smallest input hypothesis found (``Falsifying example: ...``).
"""

from __future__ import annotations

import contextlib
import copy
import csv
import functools
import io
import json
import os
import shutil
import signal
import struct
import tempfile
import time
import zlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from PIL import Image

from experiments.errors import UserError
from tests.helpers import payload_targets, train_cli, write_image_folder

EXAMPLES = int(os.environ.get("EXPERIMENTS_FUZZ_EXAMPLES", "12"))
PER_EXAMPLE_S = float(os.environ.get("EXPERIMENTS_FUZZ_TIMEOUT", "30"))

FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,  # the same examples on every run: CI stays deterministic
    database=None,  # nothing remembered between runs (that would make runs differ)
    # a reader that takes this long on a tiny input is a bug even on a loaded machine; the
    # hard bound (a hang that never returns) is PER_EXAMPLE_S, below
    deadline=timedelta(seconds=PER_EXAMPLE_S / 2),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --------------------------------------------------------------------------- the property


class Hang(BaseException):
    """Raised into a reader that has not answered within PER_EXAMPLE_S (a BaseException so
    that the reader's own ``except Exception`` cannot swallow it)."""


@contextlib.contextmanager
def bounded(seconds: float):
    """Raise ``Hang`` in the main thread after ``seconds``; pytest-timeout's own alarm (the
    suite's last resort) is put back afterwards with what was left of it."""
    outer_handler = signal.getsignal(signal.SIGALRM)
    outer_left, _ = signal.getitimer(signal.ITIMER_REAL)
    start = time.monotonic()

    def on_alarm(signum, frame):
        raise Hang(f"no answer within {seconds:.0f}s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, outer_handler)
        if outer_left:
            signal.setitimer(signal.ITIMER_REAL, max(outer_left - time.monotonic() + start, 0.1))


def answers(read, marker: Path) -> Any:
    """``read()``'s value, or None after a one-line UserError; anything else fails."""
    result = None
    try:
        with bounded(PER_EXAMPLE_S):
            result = read()
    except UserError as err:
        text = str(err).strip()
        assert text and "\n" not in text, f"a UserError of {len(text.splitlines())} lines: {err!r}"
    except Hang as err:
        raise AssertionError(f"the reader hung: {err}") from None
    assert not marker.exists(), "a payload ran: the marker file was created"
    return result


# --------------------------------------------------------------------------- hostile inputs

MARKER_NAME = "MARKER"

ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
)


def hostile_texts(marker: Path) -> list[str]:
    m = str(marker)
    return [
        "${oc.env:HOME}", "${oc.env:EXPERIMENTS_FUZZ_CANARY,canary}", "${hydra:runtime.output_dir}",
        f"${{oc.decode:'{{_target_: builtins.open, _args_: [{m}, w]}}'}}",
        f"${{oc.create:{{_target_: builtins.open, _args_: [{m}, w]}}}}",
        "${paths.output_dir}", "${nope.nothing}", "${", "${oc.env:", "${..}",
        f"$(touch {m})", f"`touch {m}`", f"; touch {m} #", f"x\ntouch {m}\n#",
        "<script>alert(1)</script>", "../../../../../../etc/passwd", "/etc/passwd", "~",
        "\x00", "\x1b[31mred", "\r\n", "\u202eevil", "\ufeff", "9" * 5000, "1e999", "nan",
        "-inf", "", " ", "torch.utils.collect_env.run", "builtins.open", "os.system",
        "hydra.utils.get_object", "torch.float32", "x" * 10_000,
    ]  # fmt: skip


KEYS = st.one_of(
    st.sampled_from([
        "_target_", "_partial_", "_args_", "_recursive_", "_convert_", "net", "data", "model",
        "hydra", "defaults", "callbacks", "in_shape", "class_names", "mean", "std", "status",
        "error", "test/acc", "val/acc", "run_dir", "seed", "epoch", "value", "monitor",
        "stats_file", "transforms", "batch_size", "image_size", "api_key", "git_dirty",
    ]),
    st.text(max_size=12),
)  # fmt: skip


def hostile_values(marker: Path) -> st.SearchStrategy:
    """Any JSON/YAML-shaped value, with payload nodes and payload strings among its leaves."""
    scalars = st.one_of(
        st.sampled_from(hostile_texts(marker)),
        st.sampled_from(list(payload_targets(marker).values())),
        st.text(max_size=20),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.sampled_from([10**400, -(10**400), 2**63, -(2**63) - 1, 0, -1, 10**9]),
        st.floats(),
        st.booleans(),
        st.none(),
    )
    return st.recursive(
        scalars,
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(KEYS, kids, max_size=4),
        max_leaves=12,
    )


def deep(n: int, opener: str, closer: str) -> str:
    return opener * n + "1" + closer * n


def whole_files(marker: Path) -> list[bytes]:
    """Whole-file replacements: each a classic way to crash, hang or run a parser."""
    tag = f'!!python/object/apply:os.system ["touch {marker}"]'
    return [
        b"", b" ", b"\n", b"null", b"~", b"[]", b"{}", b"42", b'"text"', b"true", b"-", b"---",
        ALIAS_BOMB.encode(), f"x: {tag}\n".encode(), f"- {tag}\n".encode(), tag.encode(),
        f"!!python/object/new:os.system [touch {marker}]".encode(),
        b"!!python/name:os.system", b"x: !!binary |\n  AAAA\n", b"x: !!set {a, b}\n",
        b"&a [*a]", b"a: &a\n  b: *a\n", b"%YAML 1.1\n---\nx: 1\n", b"---\na: 1\n---\nb: 2\n",
        deep(100_000, "[", "]").encode(), deep(3_000, "{a: ", "}").encode(),
        deep(3_000, '{"a": ', "}").encode(), ("- " * 2_000 + "x").encode(),
        b"9" * 5_000, b'{"test/acc": ' + b"9" * 5_000 + b"}", b'{"test/acc": 1e999}',
        b'{"test/acc": NaN, "val/acc": -Infinity}', b'{"a": 1, "a": 2}',
        b"\xff\xfe{\x00}\x00", b"\xef\xbb\xbf{}", b"\xef\xbb\xbf\xef\xbb\xbf{}", b"\x00" * 64,
        "caf\xe9: 1".encode("latin-1"), b"\x80abc", "\ud83d".encode("utf-8", "surrogatepass"),
        b"{" * 50, b'{"a": "\\ud800"}', b'"\\u0000"', b"a: 'x\n", b"\t- a", b"x: [1, 2",
        b"x: 0x_1\n", b"x: 1_000_000_000_000_000_000_000\n", b"x: .inf\ny: .nan\n",
        b"? [a, b]\n: c\n", b"? {a: 1}\n: c\n", b"1: a\nb: 2\n", b"null: x\n",
    ]  # fmt: skip


def snippets(marker: Path) -> list[bytes]:
    """Bytes spliced into a real file at a drawn position."""
    return [
        b"\x00", b"\xff", b"\xfe\xff", "\ufeff".encode(), b"\x1b[2J", b"\r", b"\t", b"'", b'"',
        b"{", b"}", b"[", b"]", b",", b":", b": :", b"\n- ", b"\n  ", b"&a ", b"*a", b"*nope",
        b"!!str ", b"!!int ", f'!!python/object/apply:os.system ["touch {marker}"]'.encode(),
        b"${oc.env:HOME}", b"${", b"\n_target_: builtins.open\n", b"1e999", b"9" * 400,
        b"NaN", b"---\n", b"...\n", b"%TAG ! tag:x,2000:\n",
    ]  # fmt: skip


def paths_of(node: Any, here: tuple = ()) -> list[tuple]:
    """Every position in a parsed document, the root first."""
    found = [here]
    if isinstance(node, dict):
        for key, value in node.items():
            found += paths_of(value, (*here, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += paths_of(value, (*here, i))
    return found


def set_at(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    node = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return doc


@st.composite
def mutated_doc(draw, doc: Any, marker: Path) -> Any:
    """``doc`` with one to three values replaced, keys added or entries deleted."""
    doc = copy.deepcopy(doc)
    values = hostile_values(marker)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths_of(doc)))
        action = draw(st.sampled_from(["replace", "add", "delete"]))
        node = doc
        for part in path:
            node = node[part]
        if action == "add" and isinstance(node, dict):
            node[draw(KEYS)] = draw(values)
        elif action == "add" and isinstance(node, list):
            node.insert(draw(st.integers(0, len(node))), draw(values))
        elif action == "delete" and path:
            parent = doc
            for part in path[:-1]:
                parent = parent[part]
            del parent[path[-1]]
        else:
            doc = set_at(doc, path, draw(values))
    return doc


@st.composite
def mutated_bytes(draw, data: bytes, marker: Path) -> bytes:
    """``data`` truncated, spliced, bit-flipped, re-encoded, or replaced whole."""
    kind = draw(st.sampled_from(["truncate", "splice", "flip", "encode", "whole", "binary"]))
    if kind == "truncate":
        return data[: draw(st.integers(0, max(len(data) - 1, 0)))]
    if kind == "splice":
        at = draw(st.integers(0, len(data)))
        return data[:at] + draw(st.sampled_from(snippets(marker))) + data[at:]
    if kind == "flip" and data:
        at = draw(st.integers(0, len(data) - 1))
        return data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    if kind == "encode":
        codec = draw(st.sampled_from(["utf-16", "utf-32", "latin-1", "utf-8-sig"]))
        return data.decode("utf-8").encode(codec, errors="replace")
    if kind == "binary":
        return draw(st.binary(max_size=64))
    return draw(st.sampled_from(whole_files(marker)))


def dump(doc: Any, fmt: str) -> bytes:
    if fmt == "json":
        return json.dumps(doc, default=str).encode()
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).encode()


def hostile_file(original: bytes, fmt: str, marker: Path) -> st.SearchStrategy[bytes]:
    """A mutation of ``original`` (a real file of the run): of its parsed data, or its bytes."""
    doc = json.loads(original) if fmt == "json" else yaml.safe_load(original)
    return st.one_of(
        mutated_doc(doc, marker).map(lambda d: dump(d, fmt)),
        mutated_bytes(original, marker),
    )


# --------------------------------------------------------------------------- one real run


@pytest.fixture(scope="module")
def world(tmp_path_factory, data_dir) -> dict[str, Path]:
    """One real tiny run of the train CLI on a small CSV image folder (so rebuilding its data
    is quick), plus a scratch folder and the marker path the payloads aim at."""
    root = tmp_path_factory.mktemp("fuzz")
    csv_file, image_dir = write_image_folder(root / "data", n=24, size=(8, 8), mode="L")
    run = train_cli(
        root / "run", data_dir, "data=image_csv", f"data.csv_file={csv_file}",
        f"data.image_dir={image_dir}", "data.val_fraction=0.25", "data.test_fraction=0.25",
        "model=mlp", "model.net.hidden_sizes=[8]", "trainer.max_epochs=1",
        "trainer.limit_train_batches=1",
    )  # fmt: skip
    job = {"status": "failed", "error": "ValueError: boom", "value": None, "overrides": []}
    (run / "job.json").write_text(json.dumps(job))  # as a failed sweep job leaves it
    for name in ("metrics.json", "data_stats.json", "env.json", ".hydra/config.yaml",
                 ".hydra/overrides.yaml", "checkpoints/best.json"):  # fmt: skip
        assert (run / name).is_file(), name
    outside = root / "outside"
    outside.mkdir()
    return {"root": root, "run": run, "csv": csv_file, "images": image_dir,
            "outside": outside, "marker": root / MARKER_NAME}  # fmt: skip


@contextlib.contextmanager
def run_copy(world: dict[str, Path], name: str, data: bytes):
    """A private copy of the run with ``name`` replaced by ``data``."""
    with tempfile.TemporaryDirectory(dir=world["root"]) as scratch:
        run = Path(shutil.copytree(world["run"], Path(scratch) / "run", symlinks=True))
        (run / name).write_bytes(data)
        yield run


def original(world, name: str) -> bytes:
    return (world["run"] / name).read_bytes()


# --------------------------------------------------------------------------- the readers


def open_saved(run: Path):
    """What eval/predict do first with a run: open it, read its sidecar, build the data
    (transforms, statistics) and the net."""
    from experiments.evaluation.saved_run import SavedRun

    saved = SavedRun(run)
    assert isinstance(saved.sidecar, dict)
    return saved.net


@FUZZ
@given(data=st.data())
def test_saved_config(world, data):
    name = ".hydra/config.yaml"
    text = data.draw(hostile_file(original(world, name), "yaml", world["marker"]), label=name)
    with run_copy(world, name, text) as run:
        answers(lambda: open_saved(run), world["marker"])


@FUZZ
@given(data=st.data())
def test_saved_overrides(world, data):
    from experiments.recorded.replay import check_resumed, read_overrides

    name = ".hydra/overrides.yaml"
    text = data.draw(hostile_file(original(world, name), "yaml", world["marker"]), label=name)
    with run_copy(world, name, text) as run:
        answers(lambda: read_overrides(run / name), world["marker"])
        answers(lambda: check_resumed([f"resume={run}"]), world["marker"])


@FUZZ
@given(data=st.data())
def test_checkpoint_sidecar(world, data):
    from experiments.recorded.folder import read_sidecar

    name = "checkpoints/best.json"
    text = data.draw(hostile_file(original(world, name), "json", world["marker"]), label=name)
    with run_copy(world, name, text) as run:
        answers(lambda: read_sidecar(run / "checkpoints" / "best.safetensors"), world["marker"])
        answers(lambda: open_saved(run), world["marker"])


@FUZZ
@given(data=st.data())
def test_metrics_json(world, data):
    from experiments.analysis.readings import Run, read_run
    from experiments.runs.sweep import finished_metrics
    from experiments.training.model_card import write_model_card

    name = "metrics.json"
    text = data.draw(hostile_file(original(world, name), "json", world["marker"]), label=name)
    with run_copy(world, name, text) as run:
        # compare never stops at one run: whatever the file holds, it is a Run or a reason
        read = answers(lambda: read_run(run, "test/acc"), world["marker"])
        assert isinstance(read, Run) or (isinstance(read, str) and "\n" not in read), read
        answers(lambda: finished_metrics(run), world["marker"])
        answers(lambda: write_model_card(run), world["marker"])


@FUZZ
@given(data=st.data())
def test_data_stats_json(world, data):
    from experiments.data.normalization import read_stats
    from experiments.evaluation.saved_run import SavedRun

    name = "data_stats.json"
    text = data.draw(hostile_file(original(world, name), "json", world["marker"]), label=name)
    with run_copy(world, name, text) as run:
        answers(lambda: read_stats(run / name), world["marker"])
        answers(lambda: SavedRun(run).datamodule, world["marker"])


@FUZZ
@given(data=st.data())
def test_job_json(world, data):
    from experiments.analysis.readings import Run, read_run
    from experiments.runs.sweep import plan_job, previous_job

    name = "job.json"
    text = data.draw(hostile_file(original(world, name), "json", world["marker"]), label=name)
    with run_copy(world, name, text) as run:
        (run / "metrics.json").unlink()  # job.json speaks for a job without metrics
        answers(lambda: previous_job(run), world["marker"])
        answers(lambda: plan_job(run, retry_failed=False), world["marker"])
        read = answers(lambda: read_run(run, "test/acc"), world["marker"])
        assert isinstance(read, Run) or (isinstance(read, str) and "\n" not in read), read


@FUZZ
@given(data=st.data())
def test_env_json(world, data):
    from experiments.runs.files import read_json_object
    from experiments.training.model_card import write_model_card

    name = "env.json"
    text = data.draw(hostile_file(original(world, name), "json", world["marker"]), label=name)
    with run_copy(world, name, text) as run:
        answers(lambda: read_json_object(run / name), world["marker"])
        answers(lambda: write_model_card(run), world["marker"])


@FUZZ
@given(raw=st.one_of(st.binary(max_size=256), st.sampled_from(whole_files(Path("/MARKER")))),
       data=st.data())  # fmt: skip
def test_files_readers(world, raw, data):
    from experiments.runs.files import parse_yaml, read_json, read_text, read_yaml

    marker = world["marker"]
    if data.draw(st.booleans(), label="with a payload"):
        raw = raw.replace(b"/MARKER", str(marker).encode())
    with tempfile.TemporaryDirectory(dir=world["root"]) as scratch:
        path = Path(scratch) / "file"
        path.write_bytes(raw)
        answers(lambda: read_text(path), marker)
        answers(lambda: read_json(path), marker)
        answers(lambda: read_yaml(path), marker)
        answers(lambda: read_yaml(path, kind=dict), marker)
        text = raw.decode("utf-8", errors="surrogateescape")
        answers(lambda: parse_yaml(text, "fuzz.yaml"), marker)


# --------------------------------------------------------------------------- user data

LABELS = ["cat", "dog", "²", "--1", "999999999", "1.5", "-1", "0", "7", " cat", "", "<b>x</b>",
          "x" * 5000, "a\nb", "\x00", "${oc.env:HOME}", "é", "1e9", "nan"]  # fmt: skip


@st.composite
def csv_bytes(draw, world: dict[str, Path]) -> bytes:
    """A CSV index: rows naming real images, names that leave the folder, symlinks, missing
    and duplicate files, odd labels; written in a drawn encoding, maybe mangled further."""
    names = [f"img_{i:03d}.png" for i in range(24)]
    odd_names = [
        "../outside.png", str(world["outside"] / "outside.png"), "/etc/passwd", "link_out.png",
        "link_in.png", "sub/../img_001.png", "./img_002.png", "sub", "missing.png", "",
        "img_000.png\x00.txt", "fifo", "a" * 5000, "C:\\x.png", "~/x.png", "img_003.png ",
    ]  # fmt: skip
    rows = draw(
        st.lists(
            st.tuples(
                st.sampled_from(names) | st.sampled_from(odd_names),
                st.sampled_from(LABELS) | st.text(max_size=8),
            ),  # fmt: skip
            min_size=0,
            max_size=12,
        )
    )
    header = draw(st.sampled_from([["filename", "label"], ["label", "filename"], ["file", "y"],
                                   ["filename"], ["filename", "label", "extra"]]))  # fmt: skip
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    for name, label in rows:
        writer.writerow([name, label][: len(header)])
    text = buf.getvalue()
    codec = draw(st.sampled_from(["utf-8", "utf-8", "utf-8-sig", "latin-1", "utf-16"]))
    data = text.encode(codec, errors="replace")
    if draw(st.booleans()):
        data = draw(mutated_bytes(data, world["marker"]))
    return data


@pytest.fixture(scope="module")
def image_world(world) -> dict[str, Path]:
    """The run's image folder, plus symlinks in and out of it, a sub-folder and a FIFO."""
    images = world["images"]
    Image.fromarray(np.zeros((8, 8), "uint8"), "L").save(world["outside"] / "outside.png")
    with contextlib.suppress(FileExistsError):
        (images / "link_out.png").symlink_to(world["outside"] / "outside.png")
        (images / "link_in.png").symlink_to(images / "img_000.png")
        (images / "sub").mkdir()
        os.mkfifo(images / "fifo")
    return world


@FUZZ
@given(data=st.data())
def test_csv_index(image_world, data):
    from experiments.data.datasets import CsvImageDataset

    world = image_world
    raw = data.draw(csv_bytes(world), label="labels.csv")
    with tempfile.TemporaryDirectory(dir=world["root"]) as scratch:
        csv_file = Path(scratch) / "labels.csv"
        csv_file.write_bytes(raw)

        def read():
            ds = CsvImageDataset(csv_file, world["images"], image_mode="L", image_size=(8, 8))
            return [ds[i] for i in range(min(len(ds), 3))]

        answers(read, world["marker"])


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


@functools.cache
def base_pngs() -> list[bytes]:
    """Small real PNGs: 8-bit grey, RGB, RGBA, palette, 1-bit, and 16-bit grey (full range)."""
    rng = np.random.default_rng(0)
    images = [
        Image.fromarray(rng.integers(0, 256, (6, 5), dtype=np.uint8), "L"),
        Image.fromarray(rng.integers(0, 256, (6, 5, 3), dtype=np.uint8), "RGB"),
        Image.fromarray(rng.integers(0, 256, (6, 5, 4), dtype=np.uint8), "RGBA"),
        Image.fromarray(rng.integers(0, 256, (6, 5, 3), dtype=np.uint8), "RGB").convert("P"),
        Image.fromarray(rng.integers(0, 2, (6, 5), dtype=np.uint8) * 255, "L").convert("1"),
        Image.fromarray(rng.integers(0, 65536, (6, 5), dtype=np.uint16)),  # mode I;16
    ]
    out = []
    for im in images:
        buf = io.BytesIO()
        im.save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


@st.composite
def png_bytes(draw) -> bytes:
    """A real PNG with a forged header (huge or zero dimensions, another bit depth or colour
    type, with a valid CRC so the decoder believes it), truncated, bit-flipped or appended to."""
    data = draw(st.sampled_from(base_pngs()))
    kind = draw(st.sampled_from(["header", "truncate", "flip", "append", "as is"]))
    if kind == "header":  # IHDR: width, height, bit depth, colour type, compression, ...
        width, height, depth, colour, comp, filt, lace = struct.unpack(">IIBBBBB", data[16:29])
        sizes = st.sampled_from([0, 1, 7, 65_535, 100_000, 2**31 - 1, 2**32 - 1])
        width = draw(sizes | st.just(width))
        height = draw(sizes | st.just(height))
        depth = draw(st.sampled_from([1, 2, 4, 8, 16, 3, 0, 255]) | st.just(depth))
        colour = draw(st.sampled_from([0, 2, 3, 4, 6, 1, 7]) | st.just(colour))
        ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, comp, filt, lace)
        return data[:8] + png_chunk(b"IHDR", ihdr) + data[33:]
    if kind == "truncate":
        return data[: draw(st.integers(0, len(data) - 1))]
    if kind == "flip":
        at = draw(st.integers(8, len(data) - 1))
        return data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    if kind == "append":
        return data + draw(st.binary(max_size=64))
    return data


@FUZZ
@given(png=png_bytes(), mode=st.sampled_from(["L", "RGB"]),
       size=st.sampled_from([None, (8, 8), (3, 5)]))  # fmt: skip
@example(png=base_pngs()[-1], mode="L", size=None)  # the 16-bit image, always
def test_image_headers(world, png, mode, size):
    from experiments.data.datasets import CsvImageDataset, decode, peek_image

    with tempfile.TemporaryDirectory(dir=world["root"]) as scratch:
        folder = Path(scratch)
        (folder / "x.png").write_bytes(png)
        (folder / "labels.csv").write_text("filename,label\nx.png,cat\nx.png.ok,dog\n")
        shutil.copy(world["images"] / "img_000.png", folder / "x.png.ok")
        marker = world["marker"]
        answers(lambda: peek_image(folder / "x.png"), marker)
        answers(lambda: decode(folder / "x.png", mode), marker)

        def read():
            ds = CsvImageDataset(folder / "labels.csv", folder, image_mode=mode, image_size=size)
            image, _ = ds[0]
            pixels = np.asarray(image)
            assert pixels.dtype == np.uint8, pixels.dtype
            if png in base_pngs() and png == base_pngs()[-1] and mode == "L" and size is None:
                # the real 16-bit image: scaled to 8 bits (v / 257), never clipped to white
                with Image.open(io.BytesIO(png)) as im:
                    wide = np.asarray(im).astype(np.float64)
                assert np.abs(pixels.astype(np.float64) - wide / 257).max() <= 1, "not scaled"
            return pixels

        answers(read, marker)
