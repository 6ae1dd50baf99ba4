"""``compare confirm_top_k=K``: the top K configs trained again on fresh seeds, to see
whether the winner keeps its rank.

A winner picked as the best of many configs on the seeds that picked it is flattered by
that choice (the winner's curse); seeds it never ran are an independent check. Each config
is re-run the way its runs were made: the first run's saved overrides
(``.hydra/overrides.yaml``), read and checked entry by entry by
``experiments.recorded.replay.read_overrides`` (a hostile entry is refused in one line before
anything runs), with ``seed=`` replaced by the fresh seeds, through
``python -m experiments.train -m``: one sweep per config over its fresh seeds, into
``<folder>/<group>/<job>``. ``hparams_search=`` is left out (it would start a search, not
replay a job); the fresh runs' configs are checked against the originals', and a key that
differs is reported. The fresh runs are then read like any other (their selected epoch)
and ranked with the same statistics.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from experiments.analysis.comparison_report import epochs_text, interval, mean_std
from experiments.analysis.groups import Comparison, Group, differing_keys, ranked, verdict_on
from experiments.analysis.readings import read_run, show_path
from experiments.analysis.verdict import Verdict
from experiments.errors import UserError
from experiments.recorded.replay import read_overrides
from experiments.runs.layout import RunDir
from experiments.tracking.sweep_summary import markdown_table

# overrides confirm leaves out (the module docstring says why); other replicate keys stay
REPLACED = ("seed", "hparams_search")


@dataclass
class Confirmation:
    folder: Path
    seeds: list[int]
    fresh: list[Group]  # the top groups on the fresh seeds, in the original order (best first)
    order: list[str]  # the original names, by their mean on the fresh seeds, best first
    verdict: Verdict | None
    kept: bool  # the original first group is first again
    differs: dict[str, list[str]]  # per group: the config keys unlike the original's

    def markdown(self, comparison: Comparison) -> str:
        c = comparison
        seeds = ", ".join(map(str, self.seeds))
        lines = [
            "## Confirmation on fresh seeds",
            "",
            f"The top {len(self.fresh)} configs trained again with seed={seeds} (seeds no "
            f"compared run used), each from its first run's saved overrides, into "
            f"`{show_path(self.folder)}`.",
            "",
        ]
        head = ["group", "n", f"{c.metric} mean ± std", f"{c.metric} 95% CI", "epoch",
                "rank before", "rank on fresh seeds"]  # fmt: skip
        rows = [
            [f.name, f.stats[c.metric].n, mean_std(f.stats[c.metric]), interval(f.stats[c.metric]),
             epochs_text(f.values[c.metric]), rank, self.order.index(f.name) + 1]
            for rank, f in enumerate(self.fresh, 1)
        ]  # fmt: skip
        lines += markdown_table(head, rows)
        first = self.fresh[0].name
        if c.best is not None:
            outcome = (
                f"{first}, the winner above, keeps its rank on fresh seeds."
                if self.kept
                else f"{first}, the winner above, does not keep its rank: {self.order[0]} "
                f"ranks first on fresh seeds."
            )
        else:
            outcome = (
                f"There was no winner above to confirm (a tie at the top); on fresh seeds "
                f"{first}, first above by its mean, "
                + ("ranks first again." if self.kept else f"ranks {self.order.index(first) + 1}.")
            )
        lines += ["", "Confirmation: " + outcome]
        if self.verdict is not None:
            lines += ["", "On fresh seeds, " + self.verdict.text + "."]
        for name, keys in self.differs.items():
            if keys:
                lines.append(
                    f"\nNote: {name}'s re-run config differs from its runs' in "
                    f"{', '.join(keys)} (the code or conf/ changed since?)."
                )
        return "\n".join(lines) + "\n"


def new_folder(base: Path) -> Path:
    """``<base>-confirm`` next to ``base``, or ``-confirm-2``, ... : never an existing one."""
    folder, n = base.parent / f"{base.name}-confirm", 2
    while folder.exists():
        folder, n = base.parent / f"{base.name}-confirm-{n}", n + 1
    return folder


def confirm(comparison: Comparison, top_k: int, n_seeds: int, folder: Path) -> Confirmation:
    """Re-run the top ``top_k`` groups of ``comparison`` with ``n_seeds`` fresh seeds each.

    Raises:
        UserError: ``top_k`` below 2 or above the number of groups, ``n_seeds`` below 2, a
            run without saved overrides, a refused saved override (before anything runs),
            a re-run that fails (its last line and folder).
    """
    groups = comparison.groups
    if not 2 <= top_k <= len(groups):
        raise UserError(
            f"confirm_top_k={top_k}: give a number from 2 to {len(groups)} (the groups "
            f"compared): the winner's rank needs another config beside it"
        )
    if n_seeds < 2:
        raise UserError(f"confirm_seeds={n_seeds}: give 2 or more (a spread needs two seeds)")

    plans = []
    for group in groups[:top_k]:
        layout = RunDir(group.runs[0].path)
        if not layout.saved_overrides.is_file():
            raise UserError(
                f"{layout.saved_overrides}: missing; confirm_top_k re-runs a config from its "
                f"saved overrides, which python -m experiments.train writes"
            )
        overrides = read_overrides(layout.saved_overrides)
        kept = [o for o in overrides if o.partition("=")[0].lstrip("+~") not in REPLACED]
        plans.append((group, kept))
    # seeds no compared run used: after the largest whole seed used
    start = max((s for g in groups for s in g.seeds if type(s) is int), default=-1) + 1
    seeds = list(range(start, start + n_seeds))
    folder.mkdir(parents=True, exist_ok=False)
    fresh, differs = [], {}
    listed = ",".join(map(str, seeds))
    for group, overrides in plans:
        target = folder / group.name
        print(f"confirm: training {group.name} with seed={listed} into {show_path(target)}",
              file=sys.stderr)  # fmt: skip
        cmd = [sys.executable, "-m", "experiments.train", "-m", *overrides, f"seed={listed}",
               f"hydra.sweep.dir={target}"]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        runs = []
        for job in sorted((p for p in target.glob("*") if p.is_dir()), key=lambda p: p.name):
            run = read_run(job, comparison.metric, comparison.ignore)
            if isinstance(run, str):
                raise UserError(f"confirm: the re-run in {job} cannot be compared: {run}")
            runs.append(run)
        if done.returncode or len(runs) != len(seeds):
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
            raise UserError(
                f"confirm: re-running {group.name} failed (exit {done.returncode}, "
                f"{len(runs)} of {len(seeds)} runs finished): {tail[0][:300]}; its "
                f"folder: {target}"
            )
        differs[group.name] = sorted(differing_keys([group.config, *(r.config for r in runs)]))
        fresh.append(Group(group.name, group.config, runs))
    metric, mode = comparison.metric, comparison.mode
    again = ranked(fresh, [metric], mode)
    order = [g.name for g in again]
    verdict = verdict_on(again, metric, mode)
    return Confirmation(folder, seeds, fresh, order, verdict, order[0] == groups[0].name, differs)
