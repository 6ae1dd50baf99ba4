"""One secret rule, applied everywhere: a secret key anywhere in the command line (nested in
a dict or list value, plural, camelCase, inside a sweep, for Hydra's own node, next to
-cd/-cp/-cn) is refused with one line naming the key, exit 2, before Hydra starts: the
canary value is in no file and not on the console. No key of conf/ counts as secret."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from experiments.config import CONF_DIR
from experiments.errors import UserError
from experiments.secrets import check_args, is_secret_key, secret_key_in
from tests.helpers import run_inproc

CANARY = "canary-7f3a9c2e"

# (an id, the arguments, the key the one line must name)
FORMS = [
    ("top-level", [f"+wandb.api_key={CANARY}"], "wandb.api_key"),
    ("nested-dict", [f"+wandb={{project:p,api_key:{CANARY}}}"], "wandb.api_key"),
    ("plural", [f"+tokens={CANARY}"], "tokens"),
    ("plural-dotted", [f"+db.passwords={CANARY}"], "db.passwords"),
    ("camel-case", [f"+HFTokens={CANARY}"], "HFTokens"),
    ("list-value", [f"+x=[1,{{credentials:{CANARY}}}]"], "x.1.credentials"),
    ("sweep-list", ["-m", f"+tracker=choice({{secret:{CANARY}}},{{secret:b}})"], "tracker.secret"),
    ("sweep-simple", ["-m", f"+hf_tokens={CANARY},other"], "hf_tokens"),
    ("hydra-node", [f"+hydra.job.env_set={{HF_TOKEN:{CANARY}}}"], "hydra.job.env_set.HF_TOKEN"),
    ("config-dir", ["-cd", str(CONF_DIR), f"+wandb={{api_key:{CANARY}}}"], "wandb.api_key"),
    ("config-path", ["-cp", str(CONF_DIR), f"+api_keys={CANARY}"], "api_keys"),
    ("config-name", ["-cn", "train", f"+dbPassword={CANARY}"], "dbPassword"),
    ("long-flags", ["--config-dir", str(CONF_DIR), "--cfg", "job", f"+x={{token:{CANARY}}}"],
     "x.token"),
    ("unparsable", [f"+wandb={{api_key:{CANARY}"], "api_key"),
]  # fmt: skip


@pytest.mark.parametrize("args,key", [f[1:] for f in FORMS], ids=[f[0] for f in FORMS])
def test_a_canary_secret_is_refused_and_written_nowhere(tmp_path, data_dir, args, key):
    res = run_inproc(
        *("-m", "experiments.train", "debug=fast", f"paths.data_dir={data_dir}"),
        *args,
        cwd=tmp_path,
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert CANARY not in res.stdout + res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith(f"error: {key}: secrets are not accepted"), res.stderr[-2000:]
    assert "oc.env" in lines[-1] and "Traceback" not in res.stderr
    # refused before Hydra starts: nothing written at all, so nothing to leak
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert [p for p in written if CANARY.encode() in p.read_bytes()] == []
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("*.yaml"))


def test_a_secret_key_that_names_an_environment_variable_is_accepted():
    check_args(["+wandb.api_key=${oc.env:WANDB_API_KEY}", "+x={token:${oc.env:HF_TOKEN}}"])
    with pytest.raises(UserError, match=r"^wandb\.api_key: "):
        check_args(["+wandb.api_key=${oc.env:WANDB_API_KEY," + CANARY + "}"])  # a default


def test_the_one_line_names_the_key_never_the_value():
    for args, _key in [f[1:] for f in FORMS]:
        with pytest.raises(UserError) as err:
            check_args(args)
        assert CANARY not in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "key",
    ["api_key", "logger.wandb.api_key", "HF_TOKEN", "HFToken", "db.password", "passwords",
     "apiKey", "apiKeys", "api-keys", "key", "tokens", "credentials", "gcp.credential",
     "private_key", "privateKey", "client_secret", "secrets", "passwd", "accessToken",
     "gh-token", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "db.passphrase"],
)  # fmt: skip
def test_credential_names_are_secret(key):
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    ["monitor", "tokenizer", "keypoints", "optimizer.lr", "passing", "max_tokens",
     "num_tokens", "max_new_tokens", "pad_token", "token_ids", "exclude_keys", "sort_key",
     "monitor_key", "kv_sep", "status", "class", "bypass", "key_padding"],
)  # fmt: skip
def test_ordinary_names_are_not_secret(key):
    assert not is_secret_key(key)


def test_text_that_is_not_an_override_is_searched_for_names():
    assert secret_key_in('+x={"api_key": 1}') == "api_key"
    assert secret_key_in("--config-name=x") is None
    assert secret_key_in("/runs/lr=0.1/seed=1") is None


def _keys(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            yield path
            yield from _keys(v, path)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _keys(v, f"{prefix}.{i}")


def test_no_key_of_conf_or_of_hydras_own_config_is_secret():
    files = sorted(Path(CONF_DIR).rglob("*.yaml"))
    assert files
    keys = set()
    for path in files:
        node = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        keys |= set(_keys(node, path.relative_to(CONF_DIR).with_suffix("").as_posix()))
    from experiments.compat.hydra import Composer

    composer = Composer(str(CONF_DIR), "train")
    for overrides in ([], ["hparams_search=optuna"], ["hydra/launcher=joblib"]):
        full = composer.compose([*overrides, "paths.data_dir=/tmp"])
        keys |= set(_keys(OmegaConf.to_container(full, resolve=False)))
    assert len(keys) > 300
    assert sorted(k for k in keys if is_secret_key(k)) == []


def test_a_secret_key_among_a_sweepers_params_is_refused(tmp_path, data_dir):
    """An ``hparams_search`` file's params become every job's overrides (its overrides.yaml,
    the sweep's files): the same rule holds for them."""
    search = tmp_path / "search" / "hparams_search"
    search.mkdir(parents=True)
    (search / "leak.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /hydra/sweeper: basic\n"
        f"hydra:\n  sweeper:\n    params:\n      +db.passwords: {CANARY},other\n"
    )
    res = run_inproc(
        *("-m", "experiments.train", "-m", "debug=fast", f"paths.data_dir={data_dir}"),
        *(f"hydra.searchpath=[file://{tmp_path / 'search'}]", "hparams_search=leak"),
        cwd=tmp_path,
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip().startswith(
        "error: db.passwords: secrets are not accepted in hydra.sweeper.params"
    )
    assert CANARY not in res.stdout + res.stderr
    assert not (tmp_path / "outputs").exists()
