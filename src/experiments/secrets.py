"""The one rule for secrets: a name (a config key, a command-line key or an environment
variable) is secret when one of its words names a credential. Secret keys are refused on
the command line (they would be saved in the run dir and sent to trackers); wherever a
config is written or logged, the values of secret keys are redacted, and so is any value
that came from a secret environment variable (``${oc.env:MY_TOKEN}`` under any key)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

REDACTED = "<redacted>"
# words of a key (split at . _ - / and camelCase) that mark it as a credential
SECRET_WORDS = frozenset(
    {"key", "apikey", "token", "secret", "password", "passwd", "credential", "credentials"}
)


def is_secret_key(key: str) -> bool:
    """``wandb.api_key``, ``HF_TOKEN``, ``db.password``, ``apiKey``: True; ``monitor``: False."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", str(key))  # apiKey -> api_Key
    words = [w for w in re.split(r"[._\-/+~\s]+", spaced.lower()) if w]
    return any(w in SECRET_WORDS for w in words) or "apikey" in "".join(words)


# a secret environment variable's value shorter than this is not looked for in strings
# ("1", "yes"): it would redact ordinary values and protect nothing
MIN_SECRET_LENGTH = 6


def secret_env_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of the environment's secret variables (``is_secret_key`` of the name)."""
    environ = os.environ if environ is None else environ
    return sorted(
        {v for k, v in environ.items() if is_secret_key(k) and len(v) >= MIN_SECRET_LENGTH},
        key=len,
        reverse=True,
    )


def redact(obj: Any, environ: Mapping[str, str] | None = None) -> Any:
    """A copy of a plain (resolved) container with the values of secret keys replaced, and
    every string that holds a secret environment variable's value (it was interpolated in,
    e.g. ``+note=${oc.env:MY_SECRET_TOKEN}``) replaced whole."""
    return _redact(obj, secret_env_values(environ))


def _redact(obj: Any, secrets: list[str]) -> Any:
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


def redacted_config(cfg: Any, resolve: bool = True) -> Any:
    """An OmegaConf config as plain containers, resolved, secrets redacted (``redact``): the
    one form in which a config is saved, printed or sent to a tracker."""
    from omegaconf import OmegaConf

    return redact(OmegaConf.to_container(cfg, resolve=resolve))


def redact_argv(argv: Sequence[str]) -> list[str]:
    """Command-line arguments with the values of ``secret_key=value`` replaced."""
    return [
        a.split("=", 1)[0] + "=" + REDACTED if "=" in a and is_secret_key(a.split("=")[0]) else a
        for a in argv
    ]


def redact_saved_config(cfg) -> None:
    """Hydra wrote .hydra/config.yaml before we ran: strip secret values from it."""
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(cfg, resolve=False)
    clean = redact(plain)
    if clean == plain or not HydraConfig.initialized():
        return
    saved = Path(HydraConfig.get().runtime.output_dir) / ".hydra" / "config.yaml"
    if saved.is_file():
        OmegaConf.save(OmegaConf.create(clean), saved)
