"""The one rule for secrets: a config key or command-line key is secret when one of its
words names a credential. Secret keys are refused on the command line (they would be
saved in the run dir and sent to trackers) and their values are redacted wherever a
config is written or logged."""

from __future__ import annotations

import re
from collections.abc import Sequence
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


def redact(obj: Any) -> Any:
    """A copy of a plain container with the values of secret keys replaced."""
    if isinstance(obj, dict):
        return {
            k: REDACTED if is_secret_key(str(k)) and v is not None else redact(v)
            for k, v in obj.items()
        }
    if isinstance(obj, list | tuple):
        return type(obj)(redact(v) for v in obj)
    return obj


def redact_argv(argv: Sequence[str]) -> list[str]:
    """Command-line arguments with the values of ``secret_key=value`` replaced."""
    return [
        a.split("=", 1)[0] + "=" + REDACTED if "=" in a and is_secret_key(a.split("=")[0]) else a
        for a in argv
    ]
