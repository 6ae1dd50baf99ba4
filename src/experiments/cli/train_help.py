"""``python -m experiments.train --help``: the groups and options read from ``conf/`` as
files, without composing anything (Hydra's own help composes every group: ~1.6 s)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

USAGE = """\
usage: python -m experiments.train [group=option ...] [key=value ...] [-m] [--cfg job]

  python -m experiments.train model=cnn optimizer.lr=0.05
  python -m experiments.train experiment=mnist seed=1
  python -m experiments.train -m optimizer.lr=0.01,0.1      (a sweep)
  python -m experiments.train resume=auto

groups (default first; conf/<group>/<option>.yaml):"""

FOOTER = """
A key belongs to the option whose file has it: data.csv_file needs data=image_csv. +key=value
adds a key the chosen option lacks; one that another option of the group uses instead
(+data.csv_file with data=digits) is refused, since the chosen option would ignore it.

--cfg job prints the composed config; --hydra-help shows Hydra's own help and flags."""


def help_text(conf_dir: str | Path, config_name: str = "train") -> str:
    conf_dir = Path(conf_dir)
    defaults: dict[str, str] = {}
    for entry in OmegaConf.load(conf_dir / f"{config_name}.yaml").get("defaults", []):
        if isinstance(entry, dict) or OmegaConf.is_dict(entry):
            (group, option), *_ = dict(entry).items()
            defaults[str(group)] = str(option)
    lines = [USAGE]
    groups = sorted(p for p in conf_dir.iterdir() if p.is_dir() and p.name not in ("paths",))
    for folder in groups:
        for group, options in _options(folder, folder.name):
            first = defaults.get(group)
            ordered = ([first] if first in options else []) + [o for o in options if o != first]
            lines.append(f"  {group:<16} {', '.join(ordered)}")
    return "\n".join(lines) + "\n" + FOOTER


def _options(folder: Path, group: str):
    options = sorted(p.stem for p in folder.glob("*.yaml") if not p.stem.startswith("_"))
    if group == "hydra/launcher":  # Hydra's launcher plugins, installed with the package
        options = ["basic", "joblib", "submitit_local", "submitit_slurm", *options]
    if options:
        yield group, options
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        yield from _options(sub, f"{group}/{sub.name}")
