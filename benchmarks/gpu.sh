#!/usr/bin/env bash
# The step-time table on one CUDA GPU: raw and hand-written loops, bare Lightning and the default
# stack on in-memory data (ResNet-18 on 32x32, the small CNN, the MLP), fp32 and bf16-mixed,
# eager and compiled; one folder of results.md per setting. Each run is cut at 110 s, so all
# four fit in 8 minutes. Usage, from the repo root of a GPU machine: bash benchmarks/gpu.sh [out]
set -uo pipefail
OUT="${1:-benchmarks/gpu}"
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || PY=python
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || exit 2
for precision in 32-true bf16-mixed; do
  for compile in false true; do
    timeout 110 "$PY" -m benchmarks.run --gpu --only step --blocks 1 --out "$OUT/$precision-compile-$compile" trainer.precision=$precision compile=$compile || echo "$precision compile=$compile: did not finish"
  done
done
