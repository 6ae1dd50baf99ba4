"""A run folder is data, not a program (trust round 4): the overrides that verify and
resume= replay are checked entry by entry before Hydra starts, reproduce.sh runs exactly the
run's overrides whatever they hold, and a corrupt run file is one line, never a traceback,
a quiet success or a lost run."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest
import yaml

from experiments.runs.provenance import reproduce_script
from tests.helpers import run_inproc, run_process, train_cli


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir):
    """One finished 1-epoch run (checkpoints, sidecars, metrics.json, env.json)."""
    root = tmp_path_factory.mktemp("replay")
    return train_cli(root / "run", data_dir, "trainer.max_epochs=1", "seed=3")


def _copy(finished: Path, tmp_path: Path) -> Path:
    run = tmp_path / "copy"
    shutil.copytree(finished, run)
    return run


def _files(run: Path) -> dict[str, str]:
    """Every file of the run and a digest of its bytes: what 'nothing lost' compares."""
    return {
        str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file()
    }


def _set_overrides(run: Path, entries: list[str]) -> Path:
    path = run / ".hydra" / "overrides.yaml"
    path.write_text(yaml.safe_dump(entries))
    return path


def _plant(tmp_path: Path, marker: Path) -> None:
    """A config file outside conf/ whose building would make ``marker``."""
    (tmp_path / "evil.yaml").write_text(f"_target_: os.mkdir\n_args_: ['{marker}']\n")


def _one_line_error(res, *named: str) -> str:
    assert res.returncode == 2, (res.returncode, res.stdout[-1500:], res.stderr[-1500:])
    err = res.stderr.strip()
    assert err.count("\n") == 0 and err.startswith("error: "), err[-2000:]
    assert "Traceback" not in res.stdout + res.stderr
    for name in named:
        assert name in err, err
    return err


def _payloads(marker: Path) -> list[tuple[str, list[str], str]]:
    """(id, entries to append to overrides.yaml, what the error line names)."""
    mkdir = f"{{_target_: os.mkdir, _args_: ['{marker}']}}"
    return [
        ("hydra-callback", [f"+hydra.callbacks.x={mkdir}"], "hydra key"),
        ("hydra-key-target", ["+hydra.callbacks.x._target_=os.mkdir",
                              f"+hydra.callbacks.x._args_=['{marker}']"], "hydra key"),
        ("callback-target-in-value", [f"+callbacks.x={mkdir}"], "os.mkdir"),
        ("group-outside-conf", ["model=" + "../" * 30 + str(marker.parent / "evil").lstrip("/")],
         "not an option of conf/model"),
        ("secret-in-dict", ["+logger.wandb={api_key: abcdefgh123}"], "secret"),
        ("newline-value", ["+tags=['a\n$(mkdir " + str(marker) + ")']"], "control character"),
        ("flag", ["--config-dir=/tmp"], "flag"),
        ("writes-elsewhere", [f"callbacks.state_dict_checkpoint.dirpath={marker}"],
         "where the run writes"),
        ("decode-resolver", ["+note='${oc.decode:x}'"], "resolver oc.decode"),
    ]  # fmt: skip


def _hostile_copy(finished: Path, tmp_path: Path, case: str):
    """A copy of the run with payload ``case`` appended to its saved overrides: (run, the
    marker its payload would create, the overrides file, what the refusal names, the run's
    files before the command)."""
    run = _copy(finished, tmp_path)
    marker = tmp_path / "pwned"
    _, entries, named = next(p for p in _payloads(marker) if p[0] == case)
    _plant(tmp_path, marker)
    saved = yaml.safe_load((run / ".hydra" / "overrides.yaml").read_text())
    path = _set_overrides(run, saved + entries)
    return run, marker, path, named, _files(run)


PAYLOAD_IDS = [p[0] for p in _payloads(Path("/m"))]


@pytest.mark.parametrize("case", PAYLOAD_IDS)
def test_verify_refuses_a_hostile_saved_override_before_anything_runs(finished, tmp_path, case):
    run, marker, path, named, before = _hostile_copy(finished, tmp_path, case)
    res = run_inproc("-m", "experiments.verify", f"run_dir={run}", cwd=tmp_path)
    _one_line_error(res, str(path), named, "refused before anything runs")
    assert "verified" not in res.stdout
    assert not marker.exists() and _files(run) == before


@pytest.mark.parametrize("case", ["hydra-callback", "callback-target-in-value", "flag"])
def test_resume_refuses_a_hostile_saved_override_and_keeps_the_run(finished, tmp_path, case):
    run, marker, path, named, before = _hostile_copy(finished, tmp_path, case)
    res = run_inproc("-m", "experiments.train", f"resume={run}", "trainer.max_epochs=2",
                  cwd=tmp_path)  # fmt: skip
    _one_line_error(res, str(path), named)
    assert not marker.exists() and _files(run) == before


ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefg", "bcdefgh", strict=True)
)
CORRUPT = {
    "overrides-not-yaml": (".hydra/overrides.yaml", "- a=1\n- [unclosed\n", "not valid YAML"),
    "overrides-alias-bomb": (".hydra/overrides.yaml", ALIAS_BOMB, "aliases expand"),
    "overrides-not-a-list": (".hydra/overrides.yaml", "seed: 1\n", "expected a list"),
    "overrides-not-strings": (
        ".hydra/overrides.yaml",
        "- {seed: 1}\n",
        "entry 1 is a dict, expected a key=value string (refused before",
    ),
    "best-sidecar-not-json": ("checkpoints/best.json", '{"epoch": 1,', "not valid JSON"),
    "last-sidecar-wrong-type": ("checkpoints/last.json", '{"epoch": "one"}', "epoch is str"),
}


@pytest.mark.parametrize("case", list(CORRUPT))
def test_resume_of_a_run_with_a_corrupt_file_is_one_line_and_loses_nothing(
    finished, tmp_path, case
):
    run = _copy(finished, tmp_path)
    name, text, named = CORRUPT[case]
    (run / name).write_text(text)
    before = _files(run)
    res = run_inproc("-m", "experiments.train", f"resume={run}", "trainer.max_epochs=2",
                  cwd=tmp_path)  # fmt: skip
    _one_line_error(res, str(run / name), named)
    assert _files(run) == before


VERIFY_CORRUPT = {
    "metrics-not-json": ("metrics.json", "{not json", "not valid JSON"),
    "metrics-without-values": ("metrics.json", '{"run_dir": "x", "wall_time_s": 1}',
                               "no metric values to compare"),
    "env-not-json": ("env.json", "\x00\x01", "env.json"),
    "env-wrong-type": ("env.json", '{"hostname": ["x"], "git_dirty": false}', "hostname"),
    "overrides-not-yaml": (".hydra/overrides.yaml", "- a=1\n- [unclosed\n", "not valid YAML"),
    "overrides-alias-bomb": (".hydra/overrides.yaml", ALIAS_BOMB, "aliases expand"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(VERIFY_CORRUPT))
def test_verify_of_a_corrupt_run_file_is_one_line_and_never_a_match(finished, tmp_path, case):
    run = _copy(finished, tmp_path)
    # were it trained again it would fail on this value: the line must come before that
    _set_overrides(run, ["trainer.max_epochs=not-a-number"])
    name, text, named = VERIFY_CORRUPT[case]
    (run / name).write_text(text)
    res = run_inproc("-m", "experiments.verify", f"run_dir={run}", cwd=tmp_path)
    _one_line_error(res, str(run / name), named)
    assert "verified" not in res.stdout


def test_verify_never_matches_weights_it_did_not_compare(finished, tmp_path):
    from safetensors.torch import save_file

    from experiments.runs.layout import RunDir

    run = _copy(finished, tmp_path)
    best = RunDir(run).best_weights
    save_file({}, best)  # a valid weights file with no tensors: nothing to compare
    res = run_inproc("-m", "experiments.verify", f"run_dir={run}", cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr[-2000:]
    assert "NOT verified" in res.stdout, res.stdout
    assert f"{best.name}: holds no tensors to compare" in res.stdout, res.stdout


# a value that would run something if it left its quotes or its comment line
HOSTILE_TAG = "x\n$(mkdir {m}1)`mkdir {m}2`; mkdir {m}3 #\t\x1b[2K\u2028end"


def _stub(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def _run_reproduce(script: Path, tmp_path: Path) -> list[str]:
    """Run the whole of ``script`` with git and python replaced by stubs; return the argv
    the stub python was given."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    argv_file = tmp_path / "argv.json"
    _stub(stubs, "git", "import sys; sys.exit(0)\n")
    python = _stub(
        stubs, "python",
        f"import json, sys; open({str(argv_file)!r}, 'w').write(json.dumps(sys.argv[1:]))\n",
    )  # fmt: skip
    clone = tmp_path / "clone"
    clone.mkdir()
    assert run_process(["bash", "-n", str(script)]).returncode == 0
    env = {**os.environ, "REPRODUCE_PYTHON": str(python),
           "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    res = run_process(["bash", str(script), str(clone), str(tmp_path / "out")], env=env,
                      cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(argv_file.read_text())


def test_reproduce_sh_runs_exactly_the_overrides_of_a_real_run(tmp_path, data_dir):
    marker = tmp_path / "pwned"
    tag = HOSTILE_TAG.format(m=marker)
    tags = f"tags=['{tag}']"
    run = tmp_path / "run"
    res = run_inproc("-m", "experiments.train", "debug=fast", tags, f"paths.data_dir={data_dir}",
                  f"hydra.run.dir={run}", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    script = run / "reproduce.sh"
    lines = script.read_text().splitlines()
    assert all(ln.startswith("#") for ln in lines[:3]), lines[:3]  # the comments stayed comments
    argv = _run_reproduce(script, tmp_path)
    assert argv == ["-m", "experiments.train", "debug=fast", tags,
                    f"paths.data_dir={data_dir}", f"hydra.run.dir={tmp_path / 'out'}"]  # fmt: skip
    assert not list(tmp_path.glob("pwned*"))


def test_reproduce_script_escapes_every_control_character(tmp_path):
    marker = tmp_path / "pwned"
    overrides = [f"+note={HOSTILE_TAG.format(m=marker)}", "seed=1", "x=it's \\' $HOME", "y=\udcff"]
    env = {"git_commit": f"abc\nmkdir {marker}4", "python": f"3\r\nmkdir {marker}5",
           "torch": "2", "git_dirty": False}  # fmt: skip
    text = reproduce_script(env, overrides)
    script = tmp_path / "reproduce.sh"
    script.write_bytes(text.encode("utf-8", "surrogateescape"))
    assert all(ord(c) >= 32 or c == "\n" for c in text) and "\u2028" not in text
    payload_lines = [ln for ln in text.splitlines() if "mkdir" in ln and not ln.startswith("#")]
    # only ever inside one quoted word: the commit's, and the command's
    assert [ln.split("=")[0].split()[0] for ln in payload_lines] == ["COMMIT", '"$PY"']
    argv = _run_reproduce(script, tmp_path)
    assert argv == ["-m", "experiments.train", *overrides, f"hydra.run.dir={tmp_path / 'out'}"]
    assert not list(tmp_path.glob("pwned*"))


# what every run of this repo saves (tests/data's runs too) replays; the rest is refused
REPLAYED = ["trainer.max_epochs=2", "model=cnn", "model.net.channels=[8,16]", "data.mean=auto",
            "augment=shift", "paths.data_dir=/data", "debug=fast", "~callbacks.early_stopping",
            "logger=null", "tags=[a,b]", "+note=${oc.env:HOME}",
            "model.net._target_=experiments.models.CNN", "model@_global_.m=cnn"]  # fmt: skip
REFUSED = {
    "hydra/launcher=ray": "hydra key", "model@hydra.x=cnn": "hydra key", "~hydra": "hydra key",
    "-m": "flag", "x=1,2": "a sweep", "model.net._target_=os.system": "os.system",
    "+x=[1,{_target_: os.system}]": "x.1._target_",
    "+x={_target_: hydra.utils.get_object, path: os.system}": "x.path",
    "+wandb.tokens=1": "secret", "+note=${oc.env:HF_TOKEN}": "HF_TOKEN",
    "model=/etc/passwd": "not an option", "~paths.output_dir": "where the run writes",
    "data.stats_file=/tmp/s.json": "where the run writes", "a=\u202e": "control character",
    "nonsense": "Hydra can parse",
}  # fmt: skip


def test_saved_overrides_are_replayed_or_refused_by_what_they_could_do(tmp_path):
    from experiments.errors import UserError
    from experiments.recorded.replay import read_overrides
    from tests.helpers import REPO

    saved = sorted(REPO.glob("tests/data/*/.hydra/overrides.yaml"))
    assert saved
    for path in saved:
        assert read_overrides(path) == yaml.safe_load(path.read_text())
    (tmp_path / "run" / ".hydra").mkdir(parents=True)
    path = _set_overrides(tmp_path / "run", [*REPLAYED, "resume=/x", "+paths.output_dir=/y"])
    assert read_overrides(path) == REPLAYED  # where a run went is not replayed
    for entry, named in REFUSED.items():
        _set_overrides(tmp_path / "run", ["seed=1", entry])
        with pytest.raises(UserError) as info:
            read_overrides(path)
        message = str(info.value)
        assert message.startswith(f"{path}: entry 2 ") and named in message, message
        assert "\n" not in message


def test_resume_continues_in_its_own_folder_whatever_the_saved_output_dir(finished, tmp_path):
    run = _copy(finished, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    saved = yaml.safe_load((run / ".hydra" / "overrides.yaml").read_text())
    _set_overrides(run, [*saved, f"paths.output_dir={elsewhere}"])
    res = run_inproc("-m", "experiments.train", f"resume={run}", "trainer.max_epochs=2",
                  cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads((run / "metrics.json").read_text())["epochs"] == 2
    assert not elsewhere.exists()
