"""torch's private API and quirks (see ``experiments.compat``): Dynamo's error switch and
graph-break counters (``torch._dynamo``), the batch norm layers' base class, and the
profiler's native noise on stderr."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings

import torch._dynamo
from torch._dynamo.utils import counters
from torch.nn.modules.batchnorm import _BatchNorm

# Kineto (torch.profiler's native side) writes these from C++ straight to stderr: its stage
# markers, and, when a CUDA build of torch runs on a machine without a GPU, a device-count
# ERROR while it collects a trace. Harmless, and not switchable from Python (pytorch/kineto:
# DeviceProperties.cpp, SyncActivityProfilerHandler.cpp).
KINETO_NOISE = ("gpuGetDeviceCount failed", "SyncActivityProfilerHandler.cpp")


@contextlib.contextmanager
def quiet_profiler():
    """Around torch.profiler's calls: its native noise (``KINETO_NOISE``) and one warning
    that does not apply here: torch warns that a scheduled profile keeps only its last
    cycle's events unless ``acc_events=True``; ours has one cycle (``repeat=1``), and
    ``acc_events=True`` segfaulted at the end of fit on this machine."""
    with warnings.catch_warnings(), native_stderr_without(*KINETO_NOISE):
        warnings.filterwarnings("ignore", message=r".*Profiler clears events", category=UserWarning)
        yield


@contextlib.contextmanager
def native_stderr_without(*noise: str):
    """Run a block whose native code writes to file descriptor 2; afterwards pass on every
    line it wrote except those containing one of ``noise``."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(ln for ln in lines if not any(n in ln for n in noise)))


# Dynamo's counters of why a frame stopped being traced; torch 2.x moved most graph-break
# reasons from "graph_break" to "unimplemented", so read both
BREAK_COUNTERS = ("graph_break", "unimplemented")


def suppress_dynamo_errors(suppress: bool) -> bool:
    """Set whether a frame Dynamo fails to compile runs in eager (with a warning) instead of
    raising; return the setting before. No public switch exists (``torch.compiler`` has
    none). Private API: ``torch._dynamo.config.suppress_errors``."""
    before = bool(torch._dynamo.config.suppress_errors)
    torch._dynamo.config.suppress_errors = suppress
    return before


def clear_graph_breaks() -> None:
    """Forget the graph breaks Dynamo has counted so far in this process."""
    for key in BREAK_COUNTERS:
        counters[key].clear()


def graph_breaks() -> dict[str, int]:
    """``{reason's first line: count}`` of the graph breaks Dynamo counted since
    ``clear_graph_breaks``. Private API: ``torch._dynamo.utils.counters``."""
    reasons: dict[str, int] = {}
    for key in BREAK_COUNTERS:
        for reason, count in counters[key].items():
            first_line = str(reason).strip().splitlines()[0]
            reasons[first_line] = reasons.get(first_line, 0) + count
    return reasons


def is_batch_norm(module) -> bool:
    """Whether ``module`` is a batch norm layer of any dimension (``BatchNorm1d/2d/3d``, their
    lazy forms, ``SyncBatchNorm`` and subclasses such as timm's ``BatchNormAct2d``): the
    layers whose running statistics a frozen backbone keeps. Private API: their common base
    ``torch.nn.modules.batchnorm._BatchNorm`` (no public one)."""
    return isinstance(module, _BatchNorm)
