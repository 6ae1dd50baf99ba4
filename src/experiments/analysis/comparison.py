"""``python -m experiments.compare``: runs grouped by config, mean ± std and a 95% CI per
group at each run's selected epoch, and a verdict on whether the best is really best.

Examples:
    python -m experiments.compare outputs/train/multiruns/2025-01-01_12-00-00_000000
    python -m experiments.compare outputs/transfer 'outputs/other/runs/*' metric=val/loss
    python -m experiments.compare outputs/sweep confirm_top_k=2

Finding runs: each path is a run folder, any folder above run folders (searched
recursively; hidden folders and the insides of a run are not searched) or a glob pattern
(``**`` allowed). A run folder is one holding ``metrics.json`` or ``.hydra/``; it is
compared when ``metrics.json`` reads as a JSON object with a finite number for the metric
and ``.hydra/config.yaml`` reads as a YAML mapping; otherwise it is skipped and listed
with the reason (unfinished or failed runs included). A run reached twice counts once.

The metric: by default each run's own ``optimized_metric`` (its saved config's, the one
its best checkpoint was chosen by) and ``optimized_mode``; runs that optimize different metrics
need ``metric=``. Test metrics are shown beside it and never used to rank (``metric=test/...``
is allowed, with a note). Every value is of the run's selected epoch: a validation metric
is ``checkpoints/best.json``'s value (or the csv row of that epoch), a test metric is of
the best checkpoint's weights; a run that kept none has its last epoch's value, labelled
last.

Grouping rule: runs are grouped by their saved config (``.hydra/config.yaml`` as Hydra
wrote it, interpolations left unresolved, so no Hydra runtime is needed), flattened to
dotted keys (a list is one value), leaving out the keys that differ from run to run
without being a choice of the experiment:

1. keys that only replicate a run: ``seed``, ``*.seed``, ``*_seed`` (the one rule:
   ``experiments.tracking.importance.is_replicate``); they pair runs across groups instead;
2. the top-level keys ``paths``, ``hydra``, ``task_name``, ``tags``, ``resume``, and any key
   given in ``ignore=`` (comma-separated; a key leaves out its whole section);
3. output locations by name: keys ending in ``stats_file``, ``dirpath``, ``save_dir``,
   ``default_root_dir``, ``output_dir`` or ``log_dir``;
4. values that interpolate a location or Hydra's runtime: a string holding ``${paths.``
   or ``${hydra:``;
5. values that name the run's own folder: a string containing its path (a config saved
   resolved).

Every other key must be equal (same type and value, as saved) for two runs to share a
group. Only keys whose values differ between groups are shown.

Statistics (``experiments.analysis.stats`` and ``.verdict``): per group n, mean, sample
std and the 95% interval of the mean, Student's t, kept inside [0, 1] for a fraction
(accuracy, F1, recall, ...). The first group is tested against each other one: a paired t
on per-seed differences when both ran the same seeds, else Welch's t; Holm-adjusted with
three groups or more. It is marked best only when it beats every other at 95%; otherwise
the groups it cannot be told apart from are marked tie, with about how many seeds would
decide it (at most "more than 100") or "no difference detectable".

Writes ``compare.md``, ``compare.csv`` (one row per group) and ``compare.png`` (the metric
by epoch, or val/acc, from each run's ``csv/metrics.csv``) into ``out``. Reads only text
files: no torch, Lightning or Hydra runtime, and matplotlib only for the PNG;
``confirm_top_k=`` starts the train CLI.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from experiments.analysis.confirm import confirm, new_folder
from experiments.analysis.groups import compare
from experiments.analysis.report import markdown, write_report
from experiments.analysis.runs import show_path
from experiments.errors import UserError
from experiments.runs.manifest import check_integrity, refresh


def default_out(paths: list[str]) -> Path:
    """Next to the inputs: the one folder given, else ``<their common folder>/compare``."""
    roots = [Path(re.split(r"[*?\[]", p, maxsplit=1)[0] or ".").resolve() for p in paths]
    if len(roots) == 1 and roots[0].is_dir() and not any(c in paths[0] for c in "*?["):
        return roots[0]
    common = Path(os.path.commonpath([str(r) for r in roots])) if roots else Path.cwd()
    return (common if common.is_dir() else common.parent) / "compare"


def command(options: dict, overrides: list[str]) -> None:
    """``python -m experiments.compare``'s work, once ``cli`` has parsed its arguments."""
    paths = options["run_dir"]
    ignore = [k for k in options["ignore"].split(",") if k.strip()]
    top_k, n_seeds = options["confirm_top_k"], options["confirm_seeds"]
    if n_seeds is not None and top_k is None:
        raise UserError("confirm_seeds= goes with confirm_top_k=K (see --help)")
    metric, mode = options["metric"], options["mode"]
    comparison = compare(paths, metric, mode, ignore)
    for path, why in comparison.skipped:  # a broken run is named, and the others compared
        print(f"warning: skipped {show_path(path)}: {why}", file=sys.stderr)
    out = options["out"] or default_out(paths)
    confirmation = None
    if top_k is not None:
        if n_seeds is None:
            n_seeds = max(2, *(len(g.runs) for g in comparison.groups[:top_k]))
        confirmation = confirm(comparison, top_k, n_seeds, new_folder(default_out(paths)))
    # the report may go into a run or sweep folder: its manifest then records what compare
    # wrote (and only that: a file modified before stays reported)
    try:
        before = check_integrity(out) if Path(out).is_dir() else None
    except UserError:  # a corrupt manifest there: verify names it; compare still reports
        before = None
    tex = options["latex"]
    wrote = write_report(comparison, out, tex, confirmation)  # first: `| head` cannot stop it
    if before is not None:
        refresh(out, before)
    print(markdown(comparison, runs_section=False), end="")
    if confirmation is not None:
        print("\n" + confirmation.markdown(comparison), end="")
    for line in wrote:
        print(line)
