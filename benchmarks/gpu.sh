#!/usr/bin/env bash
# The GPU check, benchmarks/gpu.py (its docstring says what it measures): bash benchmarks/gpu.sh [--dry-run --out DIR]
exec "$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)" -m benchmarks.gpu "$@"
