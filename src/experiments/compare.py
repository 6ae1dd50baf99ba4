"""``python -m experiments.compare``: runs grouped by config, mean ± std and a 95% CI per group.

Examples:
    python -m experiments.compare outputs/train/multiruns/2025-01-01_12-00-00_000000
    python -m experiments.compare outputs/transfer 'outputs/other/runs/*' metric=val/acc
    python -m experiments.compare outputs/sweep outputs/train/runs/2025-01-01_12-00-00 out=cmp

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

1. the top-level keys ``seed``, ``paths``, ``hydra``, ``task_name``, ``tags``, ``resume``,
   and any key given in ``ignore=`` (comma-separated; a key leaves out its whole section);
2. output locations by name: keys ending in ``stats_file``, ``dirpath``, ``save_dir``,
   ``default_root_dir``, ``output_dir`` or ``log_dir`` (e.g. ``data.stats_file``,
   ``callbacks.*.dirpath``, ``logger.csv.save_dir``, ``trainer.default_root_dir``);
3. values that interpolate a location or Hydra's runtime: a string holding ``${paths.``
   or ``${hydra:`` (e.g. ``data.root: ${paths.data_dir}/digits``, a W&B run name);
4. values that name the run's own folder: a string containing its path (a config saved
   resolved).

Every other key must be equal (same type and value, as saved) for two runs to share a
group; an interpolation such as ``${optimized_metric}`` is compared as written, the key
it points to is compared itself. Only keys whose values differ between groups are shown.

Statistics per group: n, the mean, the sample standard deviation (n - 1) and the 95%
confidence interval of the mean, mean ± t(0.975, n - 1) · std / √n, for the chosen metric
and for the standard metrics every run has (test/acc, val/acc, test/macro_f1,
test/balanced_acc, wall_time_s). Groups are sorted best first (``mode=max`` or ``min``).

Writes ``compare.md``, ``compare.csv`` (one row per group) and ``compare.png`` (val/acc,
or the metric itself when it is a ``val/`` one, by epoch from each run's
``csv/metrics.csv``: the mean over a group's runs with a min–max band) into ``out``.
Reads only text files: no torch, Lightning or Hydra runtime, and matplotlib only for
the PNG.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from experiments.analysis.groups import compare
from experiments.analysis.report import markdown, write_report
from experiments.analysis.runs import show_path
from experiments.config.saved import parse_args
from experiments.errors import UserError, exit_with

USAGE = """\
usage: python -m experiments.compare <path> [<path> ...] [metric=test/acc] [mode=max|min]
                                     [out=<folder>] [ignore=<key>,<key>...] [--latex]

Groups the finished runs found under the paths (run folders, sweep folders or any folder
above runs, searched recursively, or glob patterns) by their saved config, leaving out
seed, paths, hydra, task_name, tags, resume and per-run output locations, and prints per
group: n, mean ± std and the 95% confidence interval (Student's t) of the metric and of
test/acc, val/acc, test/macro_f1, test/balanced_acc, wall_time_s when every run has them.
Only the config keys that differ between groups are shown; the best group (mode=max:
highest mean) is marked. Writes compare.md, compare.csv and compare.png (val/acc by epoch
from csv/metrics.csv: mean per group, min-max band) into out (default: next to the inputs:
the one folder given, else <their common folder>/compare).

  metric=<name>     a key of metrics.json to rank by (default test/acc)
  mode=max|min      whether higher or lower is better (default max)
  out=<folder>      where to write compare.md, compare.csv, compare.png (also --out=<folder>;
                    default: next to the inputs)
  ignore=<keys>     more config keys (comma-separated, dotted) to leave out of the grouping
  --latex           also write compare.tex: the table as LaTeX (mean ± 95% CI, seeds)

With two groups or more a seed verdict follows the table: whether the best group beats
the runner-up at 95% (Welch's t-test on the metric over their seeds), and when it does
not, about how many seeds per group would decide it (80% power at the observed
difference).

Runs whose metrics.json or config cannot be read, or that lack the metric, are skipped and
listed (and named on stderr, one line each). Exit status 2 when no run can be compared."""


def default_out(paths: list[str]) -> Path:
    """Next to the inputs: the one folder given, else ``<their common folder>/compare``."""
    roots = [Path(re.split(r"[*?\[]", p, maxsplit=1)[0] or ".").resolve() for p in paths]
    if len(roots) == 1 and roots[0].is_dir() and not any(c in paths[0] for c in "*?["):
        return roots[0]
    common = Path(os.path.commonpath([str(r) for r in roots])) if roots else Path.cwd()
    return (common if common.is_dir() else common.parent) / "compare"


def _main(argv: list[str]) -> None:
    argv = [("out=" + a.split("=", 1)[1]) if a.startswith("--out=") else a for a in argv]
    tex = "--latex" in argv
    argv = [a for a in argv if a != "--latex"]
    own = {"metric": "test/acc", "mode": "max", "out": "", "ignore": ""}
    help_args = {"-h", "--help", "help"}
    options_args = [a for a in argv if a in help_args or ("=" in a and a.partition("=")[0] in own)]
    paths = [a for a in argv if a not in options_args]
    options, _ = parse_args(options_args, own, USAGE)
    ignore = [k for k in options["ignore"].split(",") if k.strip()]
    comparison = compare(paths, options["metric"], options["mode"], ignore)
    for path, why in comparison.skipped:  # a broken run is named, and the others compared
        print(f"warning: skipped {show_path(path)}: {why}", file=sys.stderr)
    out = options["out"] or default_out(paths)
    wrote = write_report(comparison, out, tex)  # first: `| head` cannot stop it
    print(markdown(comparison, runs_section=False), end="")
    for line in wrote:
        print(line)


def main(argv: Sequence[str] | None = None) -> None:
    """The console entry point: a UserError exits 2 with one ``error: ...`` line."""
    try:
        _main(list(sys.argv[1:] if argv is None else argv))
    except UserError as err:
        exit_with(err, 2)
    except BrokenPipeError:  # the output piped into `head` and the like: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    main()
