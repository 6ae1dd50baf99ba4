"""The one rule for secrets: a name (a config key at any depth, a command-line key or an
environment variable) is secret when its words name a credential (``is_secret_key``).

Secret keys are refused on the command line (``check_args``) wherever they sit -- a dotted
key, a key inside a dict or list value, a sweep's values -- and whatever flags come with
them: they would otherwise be saved in the run dir, the sweep's files and the trackers.
Wherever a config is written or logged, the values of secret keys are redacted, and so is
any value that came from a secret environment variable (``${oc.env:MY_TOKEN}`` under any
key)."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from experiments.errors import UserError

REDACTED = "<redacted>"

# words (split at . _ - / and camelCase; plurals count as their singular) that name a
# credential wherever they appear in a name: db_password, client_secret, gcp.credentials
CREDENTIAL_WORDS = frozenset(
    {"password", "passwd", "passphrase", "secret", "credential", "cred", "apikey",
     "accesskey", "secretkey", "privatekey", "accesstoken", "authtoken", "apitoken",
     "refreshtoken", "bearertoken", "authorization"}
)  # fmt: skip
# `token` ends a credential's name (hf_token, tokens, HFToken) unless the word before it
# says it counts or names text tokens, as model settings do: max_tokens, pad_token
TEXT_TOKEN_WORDS = frozenset(
    {"max", "min", "num", "n", "total", "new", "special", "pad", "bos", "eos", "unk", "mask",
     "sep", "cls", "start", "end", "stop", "vocab", "seq", "context", "prompt", "image",
     "patch", "register", "extra", "per", "output", "input", "generated", "class"}
)  # fmt: skip
# `key` alone is a credential (+s3.key=...); in a longer name only after a word that makes
# it one (api_key, private_key, ssh_key): sort_key, monitor_key, exclude_keys are ordinary
KEY_QUALIFIERS = frozenset(
    {"api", "access", "private", "secret", "auth", "ssh", "signing", "encryption", "license",
     "master", "client", "account", "service", "deploy", "storage", "subscription", "app",
     "session", "wandb", "hf", "openai", "aws", "gcp", "azure", "mlflow", "comet", "neptune",
     "gpg", "pgp", "rsa", "ssl", "tls"}
)  # fmt: skip


def is_secret_key(key: str) -> bool:
    """``wandb.api_key``, ``HF_TOKEN``, ``db.passwords``, ``apiKeys``, ``key``: True;
    ``monitor``, ``tokenizer``, ``max_tokens``, ``exclude_keys``, ``keypoints``: False.

    Each part of a dotted (or ``/``-separated) key is judged on its own words."""
    parts = re.split(r"[./@+~\s]+", str(key))
    return any(_is_secret_part(_words(p)) for p in parts if p)


def _words(name: str) -> list[str]:
    """``apiKeys`` -> api, key; ``HFToken`` -> hf, token; ``db-passwords`` -> db, password."""
    spaced = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)  # HFToken -> HF_Token
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", spaced)  # apiKey -> api_Key
    return [_singular(w) for w in re.split(r"[^a-zA-Z0-9]+", spaced.lower()) if w]


def _singular(word: str) -> str:
    if word.endswith("s") and not word.endswith(("ss", "us", "is")) and len(word) > 3:
        return word[:-1]  # tokens, passwords, credentials, api_keys (not `pass`, `status`)
    return word


def _is_secret_part(words: list[str]) -> bool:
    for i, word in enumerate(words):
        before = words[i - 1] if i else ""
        if word in CREDENTIAL_WORDS:
            return True
        if word == "token" and i == len(words) - 1 and before not in TEXT_TOKEN_WORDS:
            return True
        if word == "key" and (len(words) == 1 or before in KEY_QUALIFIERS):
            return True
    return False


# a secret key may be given when its value only names an environment variable
_ENV_REFERENCE = re.compile(r"\$\{oc\.env:\s*[A-Za-z_][A-Za-z0-9_]*\s*\}")
# names in text Hydra's grammar cannot parse: a name before `=` or `:`
_NAME_IN_TEXT = re.compile(r"""["']?([A-Za-z_][\w.\-/@+~]*)["']?\s*[:=]""")


def check_args(args: Sequence[str], where: str = "on the command line") -> None:
    """Refuse a command line that sets a secret key, with one line naming the key (never
    the value) and the way out.

    Every argument is looked at, whatever flags come with it (``-cd``, ``--cfg``, ``-m``):
    ``key=value`` overrides are parsed with Hydra's override grammar (parse only: nothing
    is composed or run) and walked to any depth -- dict and list values, sweeps (``a,b``,
    ``choice(...)``); text the grammar cannot parse is searched for ``name=`` and
    ``name:``. A secret key whose value is only ``${oc.env:NAME}`` is accepted: the secret
    stays in the environment, and written configs redact its value.

    Args:
        args: the arguments, as the command was given them (or overrides read elsewhere).
        where: where they came from, for the message.

    Raises:
        experiments.errors.UserError: a secret key was given.
    """
    for arg in args:
        key = secret_key_in(str(arg))
        if key is not None:
            raise UserError(
                f"{key}: secrets are not accepted {where} (they would be saved "
                f"in the run dir, the sweep's files and the trackers); put the secret in the "
                f"environment and refer to it as {key}=${{oc.env:NAME}}, or use the "
                f"tracker's own variable (e.g. WANDB_API_KEY)"
            )


def secret_key_in(arg: str) -> str | None:
    """The first secret key that the command-line argument ``arg`` sets (dotted, e.g.
    ``wandb.api_key`` for ``+wandb={api_key:...}``), or None."""
    if arg.startswith("-"):  # a flag; `--config-name=x` carries a value
        if "=" not in arg:
            return None
        arg = arg.split("=", 1)[1]
    try:
        parsed = _parser().parse_override(arg)
    except Exception:  # not an override Hydra can read: look for names in the text
        return next((k for k in _NAME_IN_TEXT.findall(arg) if is_secret_key(k)), None)
    key = parsed.get_key_element().lstrip("+~")
    if is_secret_key(key) and not _names_env(parsed.value()):
        return key
    for path, value in _inner_keys(parsed.value(), key):
        if is_secret_key(path.rpartition(".")[2]) and not _names_env(value):
            return path
    return None


def _names_env(value: Any) -> bool:
    return isinstance(value, str) and _ENV_REFERENCE.fullmatch(value.strip()) is not None


def _inner_keys(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` for every key inside a parsed override value, at any depth."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield f"{path}.{k}", v
            yield from _inner_keys(v, f"{path}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _inner_keys(v, f"{path}.{i}")
    elif isinstance(getattr(value, "list", None), list):  # a sweep: choice(...), a,b
        for v in value.list:
            yield from _inner_keys(v, path)


@functools.cache
def _parser() -> OverridesParser:
    """Hydra's override parser, made once (its grammar takes a while to load)."""
    return OverridesParser.create()


# a secret environment variable's value shorter than this is not looked for in strings
# ("1", "yes"): it would redact ordinary values and protect nothing
MIN_SECRET_LENGTH = 6


def redact(obj: Any) -> Any:
    """A copy of a plain (resolved) container with the values of secret keys replaced, and
    every string that holds a secret environment variable's value (it was interpolated in,
    e.g. ``+note=${oc.env:MY_SECRET_TOKEN}``) replaced whole."""
    secrets = {v for k, v in os.environ.items() if is_secret_key(k) and len(v) >= MIN_SECRET_LENGTH}
    return _redact(obj, secrets)


def _redact(obj: Any, secrets: set[str]) -> Any:
    if isinstance(obj, dict):
        return {
            k: REDACTED if is_secret_key(str(k)) and v is not None else _redact(v, secrets)
            for k, v in obj.items()
        }
    if isinstance(obj, list | tuple):
        return type(obj)(_redact(v, secrets) for v in obj)
    if isinstance(obj, str) and any(s in obj for s in secrets):
        return REDACTED
    return obj


def redacted_config(cfg: Any) -> Any:
    """An OmegaConf config as plain containers, resolved, secrets redacted (``redact``): the
    one form in which a config is saved, printed or sent to a tracker."""
    return redact(OmegaConf.to_container(cfg, resolve=True))


def redact_argv(argv: Sequence[str]) -> list[str]:
    """Command-line arguments with the value of each one that sets a secret key at any depth
    (``secret_key_in``) replaced whole."""
    return [a.split("=", 1)[0] + "=" + REDACTED if secret_key_in(a) else a for a in argv]


def redact_saved_config(cfg, saved) -> None:
    """Hydra wrote ``saved`` (the run's .hydra/config.yaml) before we ran: strip secret values
    from it (``saved`` None: no Hydra run, nothing was written)."""
    plain = OmegaConf.to_container(cfg, resolve=False)
    clean = redact(plain)
    if clean != plain and saved is not None and saved.is_file():
        OmegaConf.save(OmegaConf.create(clean), saved)
