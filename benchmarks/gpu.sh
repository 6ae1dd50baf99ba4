#!/usr/bin/env bash
# The step-time pairs on one CUDA GPU: hand-written loop vs bare Lightning vs the default
# stack, fp32 and bf16-mixed, eager and torch.compile, ResNet-18 on 32x32 inputs (and the
# small CNN / MLP), data in memory. Budget: one command of at most 8 minutes.
# Usage (on a GPU machine, from the repo root): bash benchmarks/gpu.sh [out_dir]
set -euo pipefail
OUT="${1:-benchmarks/gpu}"
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || PY=python
mkdir -p "$OUT"
export PYTHONPATH="$PWD:$PWD/src:${PYTHONPATH:-}"
export TORCHINDUCTOR_CACHE_DIR="$(mktemp -d)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" || true
# each case in its own process, all under one overall deadline (timeout 450 s = 7.5 min)
timeout 450 "$PY" - "$OUT" <<'PY' 2>&1 | tee "$OUT/log.txt"
import json, sys, tempfile, time
from pathlib import Path

import torch

from benchmarks.bare_lightning import BareModule, bare_trainer
from benchmarks.common import Stats, machine
from benchmarks.handloop import hand_loop
from benchmarks.probe import StepTimer
from benchmarks.run import _compose, _pieces, _step_case
from experiments.train import train

out = Path(sys.argv[1])
work = Path(tempfile.mkdtemp())
t_start = time.time()
# (name, model, shape, n, epochs, extra overrides)
cases = [
    ("resnet18 b128", "resnet18", [3, 32, 32], 6000, 3, ["data.batch_size=128"]),
    ("cnn b64", "cnn", [3, 32, 32], 6000, 3, []),
    ("mlp b64", "mlp", [1, 8, 8], 8000, 3, []),
]
rows = []
for name, model, shape, n, epochs, extra in cases:
    for precision in ("32-true", "bf16-mixed"):
        for compile_ in (False, True):
            if time.time() - t_start > 380:  # leave time to write the results
                break
            over = _step_case(model, shape, n, epochs, extra)
            over = [o for o in over if o != "trainer.accelerator=cpu"]
            over += ["trainer.accelerator=gpu", f"trainer.precision={precision}",
                     "data.pin_memory=true", f"compile={str(compile_).lower()}"]
            row = {"case": name, "precision": precision, "compile": compile_}
            tag = f"{model}-{precision}-{compile_}"
            cfg, dm, net = _pieces(work, tag + "-hand", over)
            if compile_:
                net.compile()
            row["hand ms"] = 1e3 * hand_loop(
                net, dm.train_dataloader(), dm.val_dataloader(), dm.num_classes,
                epochs=epochs, out_dir=work / tag, device="cuda",
                precision="bf16-mixed" if precision == "bf16-mixed" else "32",
                log_every=cfg.trainer.log_every_n_steps,
            )
            cfg, dm, net = _pieces(work, tag + "-bare", over)
            if compile_:
                net.compile()
            timer = StepTimer()
            bare_trainer(epochs, [timer], work / tag, "gpu", precision).fit(
                BareModule(net), datamodule=dm)
            row["bare Lightning ms"] = 1e3 * timer.step_s
            train(_compose(work, tag + "-stack", over))
            row["default stack ms"] = 1e3 * StepTimer.last.step_s
            row["stack/hand"] = row["default stack ms"] / row["hand ms"]
            print(json.dumps(row), flush=True)
            rows.append(row)
lines = ["# GPU benchmarks", "", f"{machine()}", "",
         "| case | precision | compile | hand ms | bare Lightning ms | default stack ms | stack/hand |",
         "|---|---|---|---|---|---|---|"]
for r in rows:
    lines.append(f"| {r['case']} | {r['precision']} | {r['compile']} | {r['hand ms']:.2f} | "
                 f"{r['bare Lightning ms']:.2f} | {r['default stack ms']:.2f} | {r['stack/hand']:.3f} |")
(out / "results.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
