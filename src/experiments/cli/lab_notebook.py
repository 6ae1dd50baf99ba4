"""``experiments-runs`` (``python -m experiments.cli.lab_notebook``): the lab notebook on the
command line; the index, queries, notes and report are ``analysis.notebook``'s."""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from experiments.analysis.groups import differing_keys
from experiments.analysis.notebook import query
from experiments.analysis.notebook.annotate import note, require_run, tag
from experiments.analysis.notebook.index import build
from experiments.analysis.notebook.query import FIRST, LAST, shown_value, valid_names
from experiments.analysis.notebook.report import main_metrics, varying, write_report
from experiments.analysis.readings import printable
from experiments.cli import FOLDER, parse, run
from experiments.errors import UserError

USAGE = """usage: experiments-runs COMMAND ...
       (or python -m experiments.cli.lab_notebook COMMAND ...)

  list [FOLDER] [where=EXPR] [sort=KEY] [order=asc|desc] [limit=N] [columns=a,b,...]
        every run under FOLDER (default: outputs), newest first: status, tags, start,
        duration, the metrics at each run's selected epoch and the config keys that differ.
        Broken runs are listed with the reason. EXPR: data=digits and val/acc>=0.9 and
        tag:baseline (and/or/not, parentheses; = != < <= > >= ~). limit=0: every run.
  show RUN [config=true]        one run: status, tags, note, overrides, choices, metrics
  diff RUN_A RUN_B              the config keys whose values differ, and the main metrics
  tag RUN NAME... [remove=NAME,...]   add (and remove) tags, kept in RUN/notes.json
  note RUN TEXT...              set the run's note ("" clears it)
  report [FOLDER] [out=FILE] [where=EXPR] [title=TEXT]
        one self-contained HTML page (opens offline from the file; default
        FOLDER/runs.html): a sortable, filterable table, learning curves, groups by config
        with mean and 95% interval, config diff, the sweeps' importance and parallel plots

The same table in Python: experiments.find_runs("outputs", where="...") (a pandas DataFrame).
A tag or note on a folder that is not a run is refused. Exit status 2 on a mistake."""

MAX_CELL = 36


def _split(argv: list[str], own: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The run folders (positionally or as run_dir=) and the subcommand's own options, read
    with every command's grammar (``cli.parse``)."""
    options, _ = parse(argv, {FOLDER: [], **own}, USAGE, overrides=False, many=True)
    return options.pop(FOLDER), options


def _root(positional: list[str]) -> Path:
    if len(positional) > 1:
        raise UserError(f"give one folder, not {len(positional)}: {' '.join(positional)}")
    return Path(positional[0] if positional else "outputs")


def _limit(text: str) -> int | None:
    try:
        n = int(text)
    except ValueError:
        raise UserError(f"limit={text}: must be a whole number (0: every run)") from None
    if n < 0:
        raise UserError(f"limit={n}: must be 0 or more (0: every run)")
    return n or None


def _order(text: str) -> bool | None:
    if text not in ("", "asc", "desc"):
        raise UserError(f"order={text}: must be asc or desc")
    return None if not text else text == "asc"


def cell(value: Any, metric: bool = True) -> str:
    """A table cell: a metric to 4 decimals, a config value as a command line writes it,
    lists joined, control characters escaped, cut to ``MAX_CELL``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        text = ""
    elif isinstance(value, float) and not metric:
        text = shown_value(value)
    elif isinstance(value, float):
        text = f"{value:.4f}"
    elif isinstance(value, list):
        text = ",".join(str(v) for v in value)
    elif hasattr(value, "strftime"):
        text = "" if str(value) == "NaT" else value.strftime("%Y-%m-%d %H:%M")
    else:
        text = str(value)
    text = printable(text)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def table(df, columns: list[str]) -> str:
    metric = [c == "duration_s" or "/" in c for c in columns]
    rows = [
        [cell(v, metric=m) for v, m in zip(row, metric, strict=True)]
        for row in df[columns].itertuples(index=False)
    ]
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def default_columns(df) -> list[str]:
    """name, status, tags, start, duration, the runs' main metrics, the choices and config
    keys that differ between the runs listed, note, reason."""
    skip = {*FIRST, *LAST, "epochs", "params", "wall_time_s"}
    choices = [c for c in df.columns if "/" not in c and "." not in c and c not in skip]
    keys = varying(df, [c for c in df.columns if "." in c] + ["seed"] + choices)[:8]
    cols = ["name", "status", "tags", "start", "duration_s", *main_metrics(df)[:4], *keys]
    cols += [c for c in ("note", "reason") if df[c].astype(bool).any()]
    return list(dict.fromkeys(cols))


def cmd_list(argv: list[str]) -> None:
    own = {"where": "", "sort": "", "order": "", "limit": "50", "columns": ""}
    positional, opts = _split(argv, own)
    limit, ascending = _limit(opts["limit"]), _order(opts["order"])
    # a typo in where= answers before any folder is read
    tree = query.parse(opts["where"]) if opts["where"] else None
    index = build(_root(positional))
    df = query.frame(index)
    if tree is not None:
        df = df[query.evaluate(tree, df)]
    total = len(df)
    df = query.order(df, opts["sort"] or None, ascending, limit)
    columns = [c.strip() for c in opts["columns"].split(",") if c.strip()] or default_columns(df)
    unknown = [c for c in columns if c not in df.columns]
    if unknown:
        raise UserError(
            f"columns: unknown {unknown[0]!r}; {valid_names(unknown[0], list(df.columns))}"
        )
    if len(df):
        print(table(df, columns))
    counts = df["status"].value_counts() if len(df) else {}
    by_status = ", ".join(f"{n} {s}" for s, n in counts.items())
    shown = f"{len(df)} of {total}" if len(df) < total else f"{total}"
    print(f"{shown} runs{f' ({by_status})' if by_status else ''} under {index.root}")


def _one_run(path: str) -> tuple[Any, dict]:
    index = build(require_run(path).path, cache=False)
    return index, index.records[0]


def cmd_show(argv: list[str]) -> None:
    positional, opts = _split(argv, {"config": "false"})
    if len(positional) != 1:
        raise UserError("show takes one run folder: show RUN")
    index, r = _one_run(positional[0])
    config = index.config(r)
    lines = [
        ("run", str(index.root)),
        ("status", r["status"] + (f" ({r['reason']})" if r["reason"] else "")),
        ("kind", r["kind"]),
        ("tags", ", ".join(r["tags"])),
        ("note", r["note"]),
        ("start", cell(None if r["start"] is None else datetime.fromtimestamp(r["start"]))),
        ("duration_s", cell(r["duration_s"])),
        ("selected epoch", cell(r["epoch"])),
        ("overrides", " ".join(r["overrides"])),
        ("choices", " ".join(f"{k}={v}" for k, v in sorted(r["choices"].items()))),
    ]
    for key, value in lines:
        print(f"{key:15} {printable(str(value))}")
    print("metrics (at the selected epoch):")
    for key, value in sorted(r["metrics"].items()):
        print(f"  {printable(key):30} {value:.6g}")
    if opts["config"] not in ("false", "true"):
        raise UserError(f"config={opts['config']}: must be true or false")
    if opts["config"] == "true":
        print("config (grouping keys; seeds and locations apart):")
        for key, value in sorted(config.get("config", {}).items()):
            print(f"  {printable(key)} = {printable(shown_value(value))}")


def config_of(index, record) -> dict[str, Any]:
    """A run's config for a diff: the grouping config plus its replicate keys (seeds)."""
    found = index.config(record)
    return {**found.get("config", {}), **found.get("replicates", {})}


def _shown(config: dict[str, Any], key: str) -> str:
    """A config value as a diff shows it; ``(absent)`` for a key only the other run has."""
    return printable(shown_value(config[key])) if key in config else "(absent)"


def cmd_diff(argv: list[str]) -> None:
    positional, _ = _split(argv, {})
    if len(positional) != 2:
        raise UserError("diff takes two run folders: diff RUN_A RUN_B")
    runs = [_one_run(p) for p in positional]
    for path, (_, r) in zip(positional, runs, strict=True):
        if r["config_id"] is None:
            raise UserError(f"{path}: its config cannot be read ({r['reason']})")
    (ia, ra), (ib, rb) = runs
    a, b = config_of(ia, ra), config_of(ib, rb)
    keys = sorted(differing_keys([a, b]))
    print(f"A: {printable(positional[0])}\nB: {printable(positional[1])}")
    width = max([len("key"), *(len(k) for k in keys)])
    if keys:
        print(f"{'key':{width}}  A -> B")
    else:
        print("the configs are the same (seeds and locations included)")
    for key in keys:
        print(f"{printable(key):{width}}  {_shown(a, key)} -> {_shown(b, key)}")
    for m in ("val/acc", "test/acc", "val/loss"):
        if m in ra["metrics"] or m in rb["metrics"]:
            print(f"{m:{width}}  {cell(ra['metrics'].get(m))} -> {cell(rb['metrics'].get(m))}")


def cmd_tag(argv: list[str]) -> None:
    positional, opts = _split(argv, {"remove": ""})
    if len(positional) < 1:
        raise UserError("tag takes a run folder and tag names: tag RUN NAME... [remove=NAME,...]")
    run, add = positional[0], positional[1:]
    remove = [t.strip() for t in opts["remove"].split(",") if t.strip()]
    if not add and not remove:
        raise UserError("give a tag to add (tag RUN NAME) or remove=NAME")
    tags = tag(run, add, remove)
    print(f"tags of {printable(run)}: {printable(', '.join(tags)) or '(none)'}")


def cmd_note(argv: list[str]) -> None:
    if len(argv) < 2:
        raise UserError('note takes a run folder and the text: note RUN "TEXT" ("" clears it)')
    text = note(argv[0], " ".join(argv[1:]))  # the text verbatim: '=' in it is no option
    print(f"note of {printable(argv[0])}: {'cleared' if not text else 'saved'}")


def cmd_report(argv: list[str]) -> None:
    positional, opts = _split(argv, {"out": "", "where": "", "title": ""})
    root = _root(positional)
    out = Path(opts["out"]) if opts["out"] else root / "runs.html"
    path, n, size = write_report(root, out, where=opts["where"] or None, title=opts["title"])
    print(f"wrote {printable(str(path))} ({n} runs, {size / 1e6:.1f} MB): open it in a browser")


COMMANDS = {"list": cmd_list, "show": cmd_show, "diff": cmd_diff, "tag": cmd_tag,
            "note": cmd_note, "report": cmd_report}  # fmt: skip


def _main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        if not argv:
            raise UserError(f"give a command: {', '.join(COMMANDS)} (see --help)")
        return
    command, rest = argv[0], argv[1:]
    if any(a in ("-h", "--help") for a in rest) and command != "note":
        print(USAGE)
        return
    if command not in COMMANDS:
        near = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f"did you mean {near[0]}? " if near else ""
        raise UserError(f"unknown command {command!r}; {hint}the commands: {', '.join(COMMANDS)}")
    COMMANDS[command](rest)


def main(argv: Sequence[str] | None = None) -> None:
    """The console entry point: a UserError exits 2 with one ``error: ...`` line."""
    run(_main, argv)


if __name__ == "__main__":
    main()
