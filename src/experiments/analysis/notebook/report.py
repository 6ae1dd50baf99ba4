"""One self-contained HTML page of the runs: it opens offline from the file, fetches nothing,
and runs no code from a run folder.

What is on it: a sortable, filterable table of the runs; the learning curves of the runs
ticked in the table (the best ten by default), overlaid; the runs grouped by config with
mean and 95% interval, computed here by ``analysis.significance.summarize``, the same
function compare uses; the config diff of any two runs; per sweep, the importance of each swept key
(Optuna's where the sweeper recorded it, else the spread ``tracking.importance`` computes)
and a parallel-coordinates plot.

Plots are Plotly's (its offline bundle, inlined). The bundle is 4.8 MB as text, so it is
stored gzipped and base64-encoded (2 MB) and unpacked by the browser's own
``DecompressionStream``: the page for 1,000 runs stays under 5 MB.

Safety: every value from a run folder (names, tags, notes, config values) travels as JSON
inside a ``<script type="application/json">`` block with ``<``, ``>`` and ``&`` escaped, and
is put on the page as text (``textContent``), never as HTML; strings handed to Plotly are
entity-escaped (Plotly reads a few HTML tags in labels). A Content-Security-Policy meta tag
forbids every request (``default-src 'none'``); the page counts any violation in
``data-csp-violations`` on ``<body>``, which the browser test reads.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import math
import os
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
from plotly.offline import get_plotlyjs

from experiments.analysis.groups import differing_keys, direction
from experiments.analysis.notebook import query
from experiments.analysis.notebook.index import build
from experiments.analysis.notebook.page import PAGE_CSS, PAGE_JS
from experiments.analysis.notebook.query import FIRST, shown_value
from experiments.analysis.readings import identity, printable
from experiments.analysis.significance import metric_bounds, summarize
from experiments.errors import UserError, one_line
from experiments.runs.files import read_yaml, write_text
from experiments.runs.layout import SweepDir
from experiments.tracking.importance import swept
from experiments.tracking.sweep_summary import importance as sweep_importance

MAX_METRICS = 6
MAX_KEYS = 14
STANDARD = ("test/acc", "test/balanced_acc", "test/macro_f1", "val/acc", "val/loss")
CSP = (
    "default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; "
    "img-src data: blob:; font-src data:; worker-src blob:; connect-src 'none'; "
    "form-action 'none'; base-uri 'none'"
)  # unsafe-eval: Plotly's WebGL traces (parcoords) compile shaders with new Function


def main_metrics(df) -> list[str]:
    """The metrics the table and the groups show: the runs' optimized metrics (most used
    first), then compare's standard ones, each when some run has it."""
    optimized = Counter(df["optimized_metric"].dropna()) if "optimized_metric" in df else {}
    wanted = [m for m, _ in sorted(optimized.items(), key=lambda kv: -kv[1])] + list(STANDARD)
    return [m for m in dict.fromkeys(wanted) if m in df.columns and df[m].notna().any()]


def varying(df, columns: list[str]) -> list[str]:
    """The ``columns`` whose values are not the same in every row (as text)."""
    return [c for c in columns if c in df and df[c].map(shown_value).nunique(dropna=False) > 1]


def _json_for_html(data: Any) -> str:
    """JSON that cannot end the ``<script>`` block it sits in, nor open a comment."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                          ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):  # fmt: skip
        text = text.replace(char, escaped)
    return text


def _plain(value: Any) -> Any:
    """A cell as JSON: NaN/NaT as null, numbers rounded to 6 significant digits, lists as
    text, timestamps as ISO text."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return None if not math.isfinite(value) else float(f"{value:.6g}")
    if hasattr(value, "isoformat"):
        return None if str(value) == "NaT" else value.isoformat(timespec="seconds")
    if isinstance(value, list):
        return ", ".join(printable(str(v)) for v in value)
    with contextlib.suppress(TypeError, ValueError):  # pd.isna of a value it cannot test
        if pd.isna(value):
            return None
    if hasattr(value, "item"):  # a numpy scalar
        return _plain(value.item())
    return printable(str(value))


def page_data(root: str | os.PathLike, where: str | None = None, title: str = "") -> dict:
    """Everything the page shows, as plain data (the HTML only lays it out)."""
    tree = query.parse(where) if where else None  # a bad where fails before the folder is read
    index = build(Path(root))
    df = query.frame(index)
    if tree is not None:
        df = df[query.evaluate(tree, df)]
    df = query.order(df, "start", False, None)
    records = {r["name"]: r for r in index.records}
    metrics = main_metrics(df)[:MAX_METRICS]
    choices = [c for c in df.columns if c in {k for r in index.records for k in r["choices"]}]
    top_level = {k for c in index.configs.values() for k in c.get("config", {}) if "." not in k}
    config_keys = [c for c in df.columns if "." in c or c in top_level]
    differing = varying(df, choices + config_keys)[:MAX_KEYS]
    columns = [*FIRST, *metrics, *differing, "reason"]
    rows = [[_plain(v) for v in row] for row in df[columns].itertuples(index=False)]
    kinds = {c: ("num" if c in ("duration_s", "epoch", *metrics) else "text") for c in columns}
    kinds["start"] = "date"
    curves = [records[name]["curves"] or None for name in df["name"]]
    # the diff: every key that differs anywhere (keys the same in every run cannot differ)
    all_config = {}
    for name in df["name"]:
        found = index.config(records[name])
        all_config[name] = {**found.get("config", {}), **found.get("replicates", {})}
    diff_keys = sorted(differing_keys(list(all_config.values())))
    diff_values = [[_plain(shown_value(all_config[n].get(k))) if k in all_config[n] else None
                    for k in diff_keys] for n in df["name"]]  # fmt: skip
    finished = df[df["status"] == "finished"]
    grouping = {n: index.config(records[n]).get("config", {}) for n in finished["name"]}
    return {
        "title": printable(title or f"Runs under {index.root}"),
        "root": printable(str(index.root)),
        "generated": datetime.now().isoformat(timespec="seconds"),
        "where": printable(where or ""),
        "columns": [{"key": c, "kind": kinds[c]} for c in columns],
        "metrics": metrics,
        # the metrics whose best is lowest (the runs' optimized_mode, else the name), for
        # the page's "best 10" button
        "lower": [m for m in metrics if direction(m, query.optimized_pairs(df))[0] == "min"],
        "rows": rows,
        "curves": curves,
        "diff": {"keys": diff_keys, "values": diff_values},
        "groups": groups(finished, metrics, differing, grouping),
        "sweeps": sweeps(finished, records, index.root, metrics),
    }


def groups(df, metrics: list[str], keys: list[str], configs: dict[str, dict]) -> dict:
    """Per metric and per way of grouping (``config``: compare's grouping, every config key
    apart from seeds and locations; or one key): the groups with n, mean, std and the 95%
    interval (``significance.summarize``, as compare).

    Args:
        df: the finished runs.
        keys: the choices and config keys that differ between runs (the ways to group).
        configs: each run's grouping config by its name.
    """
    by_config = {
        name: frozenset((k, identity(v)) for k, v in configs.get(name, {}).items())
        for name in df["name"]
    }
    shown = [k for k in keys if k != "seed"]
    out: dict[str, dict] = {}
    for metric in metrics:
        has = df[df[metric].notna()]
        if has.empty:
            continue
        lower = any(w in metric for w in ("loss", "error", "time", "ece"))
        out[metric] = {}
        for way in ["config", *shown]:
            buckets: dict[Any, list[int]] = {}
            labels = has["name"].map(by_config) if way == "config" else has[way].map(identity)
            for i, label in labels.items():
                buckets.setdefault(label, []).append(i)
            found = []
            for members in buckets.values():
                values = [float(has.at[i, metric]) for i in members]
                stats = summarize(values, metric_bounds(metric))
                first = has.loc[members[0]]
                parts = shown if way == "config" else [way]
                name = " ".join(f"{k}={shown_value(first[k])}" for k in parts)
                found.append({
                    "label": printable(name or "(one config)"),
                    "n": stats.n, "mean": _plain(stats.mean), "std": _plain(stats.std),
                    "low": _plain(stats.ci_low), "high": _plain(stats.ci_high),
                    "runs": [printable(str(has.at[i, "name"])) for i in members],
                })  # fmt: skip
            out[metric][way] = sorted(found, key=lambda g: g["mean"] if lower else -g["mean"])
    return out


def sweeps(df, records: dict, root: Path, metrics: list[str]) -> list[dict]:
    """Per sweep with two or more finished jobs: the importance of each swept key and the
    jobs' settings for the parallel-coordinates plot."""
    out = []
    jobs = df[(df["kind"] == "job") & (df["sweep"] != "")]
    for sweep, members in jobs.groupby("sweep", sort=True):
        metric = members["optimized_metric"].dropna()
        metric = metric.iloc[0] if len(metric) else (metrics[0] if metrics else None)
        if metric is None or metric not in members.columns:
            continue
        rows = [{"overrides": " ".join(records[n]["overrides"]), metric: v}
                for n, v in zip(members["name"], members[metric], strict=True)]  # fmt: skip
        done, keys = swept(rows, metric)
        if len(done) < 2 or not keys:
            continue
        path = SweepDir(root / sweep).optimization_results  # our Optuna sweeper's record
        try:
            results, error = read_yaml(path, {}, kind=dict), ""
        except UserError as err:
            results, error = {}, f" ({one_line(err)})"
        importance, how = sweep_importance(done, keys, metric, results)
        out.append({
            "name": printable(str(sweep)), "metric": metric, "how": printable(how + error),
            "importance": [[printable(k), _plain(v)] for k, v in importance.items()],
            "keys": [printable(k) for k in keys],
            "rows": [[_plain(_maybe_number(r.get(k))) for k in keys] + [_plain(r[metric])]
                     for r in done],
        })  # fmt: skip
    return out


def _maybe_number(text: Any) -> Any:
    try:
        return float(text)
    except (TypeError, ValueError):
        return printable(str(text))


def plotly_bundle() -> str:
    """Plotly's offline bundle, gzipped and base64-encoded (see the module docstring)."""
    return base64.b64encode(gzip.compress(get_plotlyjs().encode(), 9, mtime=0)).decode()


def html(data: dict) -> str:
    title = data["title"].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{title}</title>\n<style>{PAGE_CSS}</style>\n"
        "<script>window.__csp=[];document.addEventListener('securitypolicyviolation',"
        "function(e){window.__csp.push(e.blockedURI||e.violatedDirective);"
        "if(document.body)document.body.dataset.cspViolations=window.__csp.length;});"
        '</script>\n</head><body data-csp-violations="0">\n'
        f'<script type="application/json" id="data">{_json_for_html(data)}</script>\n'
        f'<script type="application/octet-stream" id="plotly-gz">{plotly_bundle()}</script>\n'
        f"<script>{PAGE_JS}</script>\n</body></html>\n"
    )


def write_report(
    root: str | os.PathLike, out: str | os.PathLike, where: str | None = None, title: str = ""
) -> tuple[Path, int, int]:
    """Write the page for the runs under ``root`` (those ``where`` selects) to ``out``.

    Returns:
        ``(out, number of runs, size in bytes)``.

    Raises:
        UserError: a bad ``root`` or ``where``, plotly missing, ``out`` not writable.
    """
    data = page_data(root, where, title)
    text = html(data).encode()
    out = Path(out)
    if out.is_dir():
        raise UserError(f"out={out}: a folder; give a file name, e.g. out={out / 'runs.html'}")
    try:
        write_text(out, text)
    except OSError as err:
        raise UserError(f"out={out}: cannot write it ({one_line(err)})") from None
    return out, len(data["rows"]), len(text)
