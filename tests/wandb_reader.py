"""Read an offline W&B run back from its ``run-<id>.wandb`` file.

Offline mode writes no summary JSON; the run lives only in this record log (LevelDB's
log format: a 7-byte ``:W&B`` header, 32 KiB blocks, each record chunk behind a 7-byte
crc/length/type header) of ``wandb_internal_pb2.Record`` protobufs.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str | Path):
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < 7:  # block trailer padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            break
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (FULL, FIRST):
            pending = chunk
        else:
            pending += chunk
        if kind in (FULL, LAST):
            rec = pb.Record()
            rec.ParseFromString(pending)
            yield rec


def read_run(run_dir: str | Path) -> dict:
    """``{"run": RunRecord, "config": {...}, "history": [rows], "exit": code}`` of one run."""
    files = list(Path(run_dir).rglob("run-*.wandb"))
    assert len(files) == 1, files
    out = {"run": None, "config": {}, "history": [], "exit": None, "file": files[0]}
    for rec in records(files[0]):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out["run"] = rec.run
            for item in rec.run.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in rec.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "history":
            out["history"].append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in rec.history.item
                }
            )
        elif kind == "exit":
            out["exit"] = rec.exit.exit_code
    return out
