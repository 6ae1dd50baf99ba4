"""A run folder is data, not a program (trust round 4): a payload that would create a marker
file if anything ran it is planted in one place of a copy of a real run -- its saved config,
its saved overrides, a checkpoint sidecar, a checkpoint (the weights as runs write them now,
or an older run's best.pt/last.pt), a note -- and every command that
reads run folders is run on it through the real CLI. The marker never appears, and the
command answers as it decides (exit 0, 1 or 2) without a traceback.

The payloads are real: each ``_target_`` below creates the marker when Hydra instantiates it
(``test_the_payloads_are_live`` proves it), the pickles create it when unpickled without
``weights_only``, and the reproduce.sh line would create it if a newline ended its comment.

eval, predict, calibrate, export and compare run once per place. verify, resume and
reproduce train again (6-20 s each here), so for them the places a run's own files hold
(config, sidecar, checkpoint, note) are planted together in one copy (``run_files``),
beside the two places that decide what they train (the overrides, with and without a
YAML tag): each of those commands then reads every planted file in one run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from experiments.runs.layout import OLD_WEIGHTS_SUFFIX, RunDir
from experiments.runs.weights import read_state_dict
from tests.helpers import Payload, payload_targets, run_inproc, run_process, train_cli

# the smallest real run that has every file a finished run has (checkpoints, sidecars,
# data_counts.json, env.json, reproduce.sh): verify and resume train it again, so it is tiny
TINY = ("trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1", "model.net.hidden_sizes=[8]", "seed=3",
        "logger=none")  # fmt: skip

READERS = ("eval", "predict", "calibrate", "export", "compare")  # read the run, train nothing
RETRAINERS = ("verify", "resume", "reproduce")  # train again from the run


def pickle_payload(marker: Path) -> Path:
    """A checkpoint-shaped pickle that creates ``marker`` when loaded with weights_only=False."""
    path = marker.parent / "payload.ckpt"
    torch.save({"state_dict": {}, "pwn": Payload(str(marker))}, path)
    return path


def shell_line(marker: Path) -> str:
    """A value that, if a newline ended a comment line of a shell script, runs ``touch``."""
    return f"x\ntouch {marker}\n#"


def plant_config(run: Path, marker: Path) -> None:
    path = run / ".hydra" / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    t = payload_targets(marker)
    cfg["model"]["net"] = t["write_file"]
    cfg["data"]["train_transform"]["transforms"].insert(0, t["shell"])
    cfg["data"]["target_transform"] = t["unpickle"]
    cfg["callbacks"]["pwn"] = t["open"]
    cfg["trainer"]["plugins"] = [t["shell"]]
    cfg["tags"] = [shell_line(marker)]
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))


def plant_config_tag(run: Path, marker: Path) -> None:
    with open(run / ".hydra" / "config.yaml", "a") as f:
        f.write(f'pwn: !!python/object/apply:os.system ["touch {marker}"]\n')


def plant_overrides(run: Path, marker: Path) -> None:
    path = run / ".hydra" / "overrides.yaml"
    saved = yaml.safe_load(path.read_text())
    hook = f"{{_target_:torch.utils.collect_env.run,command:'touch {marker}'}}"
    saved += [
        f"+hydra.callbacks.pwn={hook}",
        f"+callbacks.pwn={{_target_:builtins.open,_args_:['{marker}',w]}}",
        "model.net._target_=torch.utils.collect_env.run",
        f"+model.net.command='touch {marker}'",
        f"tags=['{shell_line(marker)}']",
        "--config-dir=/",
    ]
    path.write_text(yaml.safe_dump(saved))


def plant_overrides_tag(run: Path, marker: Path) -> None:
    path = run / ".hydra" / "overrides.yaml"
    text = path.read_text() + f'- !!python/object/apply:os.system ["touch {marker}"]\n'
    path.write_text(text)


def plant_sidecar(run: Path, marker: Path) -> None:
    t = payload_targets(marker)
    for name in ("best.json", "last.json"):
        path = run / "checkpoints" / name
        sidecar = json.loads(path.read_text())
        sidecar["net"] = t["write_file"]
        sidecar["_target_"] = t["shell"]["_target_"]
        sidecar["command"] = t["shell"]["command"]
        sidecar["class_names"][0] = f"<script>alert(1)</script>$(touch {marker})"
        path.write_text(json.dumps(sidecar))


def _weights(run: Path) -> list[Path]:
    """The run's best and last weights files, and no manifest.json: whoever can rewrite the
    weights can delete it too (the run then reads as an older one), so the readers' own
    loading is what meets the payload, not the manifest check in front of it."""
    RunDir(run).manifest.unlink(missing_ok=True)
    return [RunDir(run).best_weights, RunDir(run).last_weights]


def plant_checkpoint(run: Path, marker: Path) -> None:
    # a pickle that carries the payload beside the run's tensors, under the weights' own name
    # (best.safetensors now): it must be parsed as safetensors and refused, never unpickled
    for path in _weights(run):
        # copies: safetensors maps the file, and rewriting a mapped file under its tensors
        # is a bus error
        state = {k: v.clone() for k, v in read_state_dict(path).items()}
        torch.save({**state, "pwn": Payload(str(marker))}, path)
    path = run / "checkpoints" / "last.ckpt"
    ckpt = torch.load(path, weights_only=False)  # our own file, written by the run
    ckpt["pwn"] = Payload(str(marker))
    ckpt["callbacks"]["pwn"] = Payload(str(marker))
    torch.save(ckpt, path)


def plant_old_checkpoint(run: Path, marker: Path) -> None:
    # an older run's weights (best.pt, last.pt: torch.save pickles), the payload inside:
    # loaded with torch.load(weights_only=True), which refuses it
    for path in _weights(run):
        state = read_state_dict(path)
        torch.save({**state, "pwn": Payload(str(marker))}, path.with_suffix(OLD_WEIGHTS_SUFFIX))
        path.unlink()
    assert RunDir(run).best_weights.suffix == OLD_WEIGHTS_SUFFIX  # what the readers will open


NOTE = "<script>alert(1)</script> $(touch {m}) `touch {m}`\n"


def plant_note(run: Path, marker: Path) -> None:
    note = NOTE.format(m=marker)
    (run / "model_card.md").write_text(note)
    counts = json.loads((run / "data_counts.json").read_text())
    for split in counts.values():
        split[note.strip()] = split.pop(next(iter(split)))
    (run / "data_counts.json").write_text(json.dumps(counts))
    env = json.loads((run / "env.json").read_text())
    env["hostname"] = note
    (run / "env.json").write_text(json.dumps(env))


def plant_run_files(run: Path, marker: Path) -> None:
    for plant in (plant_config, plant_sidecar, plant_checkpoint, plant_note):
        plant(run, marker)


PLACES = {
    "config": plant_config,
    "config_tag": plant_config_tag,
    "overrides": plant_overrides,
    "overrides_tag": plant_overrides_tag,
    "sidecar": plant_sidecar,
    "checkpoint": plant_checkpoint,
    "old_checkpoint": plant_old_checkpoint,
    "note": plant_note,
    "run_files": plant_run_files,
}
# eval meets every place on its own; the other readers open a run through the same SavedRun,
# so they get every place at once (run_files) plus the two that change how a file is parsed
CELLS = [(place, "eval") for place in PLACES if place != "run_files"]
CELLS += [(place, command) for command in READERS if command != "eval"
          for place in ("run_files", "config_tag", "old_checkpoint")]  # fmt: skip
CELLS += [(place, command) for command in RETRAINERS
          for place in ("overrides", "overrides_tag", "run_files")]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir) -> Path:
    # nothing hostile in the run itself: verify and resume must get as far as its files
    return train_cli(tmp_path_factory.mktemp("payloads") / "run", data_dir, *TINY)


def written(run: Path) -> dict[Path, tuple[int, int]]:
    return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in run.rglob("*") if p.is_file()}


def run_command(command: str, run: Path, tmp_path: Path, data_dir: Path):
    if command == "predict":
        images = tmp_path / "images"
        images.mkdir()
        for image in sorted((data_dir / "digits" / "images").glob("*.png"))[:3]:
            shutil.copy(image, images)
        return run_inproc("-m", "experiments.predict", f"run_dir={run}", f"input={images}",
                       f"output={tmp_path / 'pred.csv'}", cwd=tmp_path)  # fmt: skip
    if command == "export":
        return run_inproc("-m", "experiments.export", f"run_dir={run}", "format=torchscript",
                       cwd=tmp_path)  # fmt: skip
    if command == "compare":
        return run_inproc("-m", "experiments.compare", str(run), f"out={tmp_path / 'cmp'}",
                       cwd=tmp_path)  # fmt: skip
    if command in ("resume", "reproduce"):
        res = run_inproc("-m", "experiments.train", f"resume={run}", "trainer.max_epochs=2",
                      cwd=tmp_path)  # fmt: skip
        if command == "resume" or res.returncode != 0:
            return res
        # reproduce.sh as resume rewrote it from the replayed overrides: a clone that does not
        # exist stops it after its comment lines, which is where a newline would break out
        return run_process(["bash", str(run / "reproduce.sh"), str(tmp_path / "no-clone")],
                           cwd=tmp_path)  # fmt: skip
    return run_inproc("-m", f"experiments.{command}", f"run_dir={run}", cwd=tmp_path)


@pytest.mark.parametrize("place, command", CELLS)
def test_a_planted_payload_never_runs(trained, tmp_path, data_dir, place, command):
    marker = tmp_path / "MARKER"
    pickle_payload(marker)
    run = Path(shutil.copytree(trained, tmp_path / "run"))
    PLACES[place](run, marker)
    before = written(run)
    res = run_command(command, run, tmp_path, data_dir)
    report = f"{place} x {command}: exit {res.returncode}\n{res.stderr[-2500:]}"
    assert not marker.exists(), "the payload ran: " + report
    assert "Traceback" not in res.stderr, report
    assert res.returncode in (0, 1, 2), report
    if place.endswith("checkpoint") and command in READERS and command != "compare":
        # no manifest in front of it: the weights loader itself met the payload and refused it
        assert res.returncode == 2 and "cannot be loaded" in res.stderr, report
    if res.returncode == 2 and command != "reproduce":  # a refusal is one line
        lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
        assert len(lines) == 1, report
    # what a command writes from a note (a model card) holds it escaped, never as markup
    for path, stamp in written(run).items():
        if path.suffix in (".md", ".html") and before.get(path) != stamp:
            assert "<script>" not in path.read_text(errors="replace"), f"{path}: {report}"


# torchvision.io warns on import that its image IO is deprecated: the payload's own module
@pytest.mark.filterwarnings("ignore:The image decoding and encoding:DeprecationWarning")
def test_the_payloads_are_live(tmp_path):
    """Each payload creates its marker when run, so the test above can fail."""
    from hydra.utils import instantiate

    for name, node in payload_targets(tmp_path / "m").items():
        marker = tmp_path / "m"
        pickle_payload(marker)
        marker.unlink(missing_ok=True)
        try:
            instantiate(node)
        except Exception:  # load_from_checkpoint fails after unpickling: the marker is made
            pass
        assert marker.exists(), name
    marker.unlink()
    torch.load(pickle_payload(marker), weights_only=False)
    assert marker.exists()
