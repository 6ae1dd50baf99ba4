"""``python -m experiments.compare``: runs grouped by config, mean ± std and a 95% CI per
group at each run's selected epoch, and a verdict on whether the best is really best (the
metric, the statistics and the files written: ``cli.commands.COMPARE_USAGE``).

Finding runs: each path is a run folder, any folder above run folders (searched
recursively; hidden folders and the insides of a run are not searched) or a glob pattern
(``**`` allowed). A run folder is one holding ``metrics.json`` or ``.hydra/``; it is
compared when ``metrics.json`` reads as a JSON object with a finite number for the metric
and ``.hydra/config.yaml`` reads as a YAML mapping; otherwise it is skipped and listed
with the reason (unfinished or failed runs included). A run reached twice counts once.

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
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from experiments.analysis.comparison_report import markdown, write_report
from experiments.analysis.confirm import confirm, new_folder
from experiments.analysis.groups import compare
from experiments.analysis.readings import show_path
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
    # first: `| head` cannot stop it
    wrote = write_report(comparison, out, options["latex"], confirmation)
    if before is not None:
        refresh(out, before)
    print(markdown(comparison, runs_section=False), end="")
    if confirmation is not None:
        print("\n" + confirmation.markdown(comparison), end="")
    print("\n".join(wrote))
