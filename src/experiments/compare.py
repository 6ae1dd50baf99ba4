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
from collections.abc import Sequence
from pathlib import Path

from experiments.analysis.groups import compare
from experiments.analysis.report import markdown, write_report
from experiments.analysis.runs import show_path
from experiments.config.saved import parse_args
from experiments.errors import UserError, exit_with
from experiments.runs.layout import METRICS
from experiments.runs.manifest import check_integrity, refresh

USAGE = f"""\
usage: python -m experiments.compare <path> [<path> ...] [metric=<name>] [mode=max|min]
                                     [out=<folder>] [ignore=<key>,<key>...] [--latex]
                                     [confirm_top_k=K [confirm_seeds=N]]

Groups the finished runs found under the paths (run folders, sweep folders or any folder
above runs, searched recursively, or glob patterns) by their saved config, leaving out
replicate keys (seed, *.seed, *_seed), paths, hydra, task_name, tags, resume and per-run
output locations, and prints per group: n, mean ± std and the 95% confidence interval
(Student's t, kept inside [0, 1] for accuracy-like metrics) of the metric at each run's
selected epoch (the one the best checkpoint keeps; a last-epoch value is labelled last),
and of test/acc, test/balanced_acc, test/macro_f1, val/acc, wall_time_s when every run
has them.
Writes compare.md, compare.csv and compare.png into out (default: next to the inputs).

  metric=<name>     the metric to rank by (default: the runs' own optimized_metric, a
                    validation metric; test metrics are shown, not used to rank)
  mode=max|min      whether higher or lower is better (default: the runs' optimized_mode)
  out=<folder>      where to write compare.md, compare.csv, compare.png (also --out=<folder>)
  ignore=<keys>     more config keys (comma-separated, dotted) to leave out of the grouping
  --latex           also write compare.tex: the table as LaTeX (mean and 95% CI, seeds)
  confirm_top_k=K   train the top K configs again on fresh seeds (their saved overrides,
                    through python -m experiments.train, into <compared folder>-confirm)
                    and say whether the winner keeps its rank
  confirm_seeds=N   fresh seeds per config for confirm_top_k (default: the most seeds a
                    top group ran, at least 2)

With two groups or more a verdict follows the table: the first group against each other
(paired t on the seeds both ran, else Welch's t; Holm-adjusted for 3+ groups). It is
marked best only when it beats every other at 95%; otherwise the groups tied with it are
marked tie, with about how many seeds per group would decide it (or "more than 100", or
"no difference detectable").

Runs whose {METRICS} or config cannot be read, or that lack the metric, are skipped and
listed (and named on stderr, one line each). Exit status 2 when no run can be compared."""


def default_out(paths: list[str]) -> Path:
    """Next to the inputs: the one folder given, else ``<their common folder>/compare``."""
    roots = [Path(re.split(r"[*?\[]", p, maxsplit=1)[0] or ".").resolve() for p in paths]
    if len(roots) == 1 and roots[0].is_dir() and not any(c in paths[0] for c in "*?["):
        return roots[0]
    common = Path(os.path.commonpath([str(r) for r in roots])) if roots else Path.cwd()
    return (common if common.is_dir() else common.parent) / "compare"


AUTO = "<auto>"  # an option not given (an empty metric= is an error, not this)


def _count(options: dict, key: str) -> int | None:
    text = options[key]
    if text == AUTO:
        return None
    try:
        return int(text)
    except ValueError:
        raise UserError(f"{key}={text}: must be a whole number") from None


def _main(argv: list[str]) -> None:
    argv = [("out=" + a.split("=", 1)[1]) if a.startswith("--out=") else a for a in argv]
    tex = "--latex" in argv
    argv = [a for a in argv if a != "--latex"]
    own = {"metric": AUTO, "mode": AUTO, "out": "", "ignore": "", "confirm_top_k": AUTO,
           "confirm_seeds": AUTO}  # fmt: skip
    help_args = {"-h", "--help", "help"}
    options_args = [a for a in argv if a in help_args or ("=" in a and a.partition("=")[0] in own)]
    paths = [a for a in argv if a not in options_args]
    options, _ = parse_args(options_args, own, USAGE)
    ignore = [k for k in options["ignore"].split(",") if k.strip()]
    top_k, n_seeds = _count(options, "confirm_top_k"), _count(options, "confirm_seeds")
    if n_seeds is not None and top_k is None:
        raise UserError("confirm_seeds= goes with confirm_top_k=K (see --help)")
    metric = None if options["metric"] == AUTO else options["metric"]
    mode = None if options["mode"] == AUTO else options["mode"]
    comparison = compare(paths, metric, mode, ignore)
    for path, why in comparison.skipped:  # a broken run is named, and the others compared
        print(f"warning: skipped {show_path(path)}: {why}", file=sys.stderr)
    out = options["out"] or default_out(paths)
    confirmation = None
    if top_k is not None:
        from experiments.analysis.confirm import confirm, new_folder

        if n_seeds is None:
            n_seeds = max(2, *(len(g.runs) for g in comparison.groups[:top_k]))
        confirmation = confirm(comparison, top_k, n_seeds, new_folder(default_out(paths)))
    # the report may go into a run or sweep folder: its manifest then records what compare
    # wrote (and only that: a file modified before stays reported)
    try:
        before = check_integrity(out) if Path(out).is_dir() else None
    except UserError:  # a corrupt manifest there: verify names it; compare still reports
        before = None
    wrote = write_report(comparison, out, tex, confirmation)  # first: `| head` cannot stop it
    if before is not None:
        refresh(out, before)
    print(markdown(comparison, runs_section=False), end="")
    if confirmation is not None:
        print("\n" + confirmation.markdown(comparison), end="")
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
