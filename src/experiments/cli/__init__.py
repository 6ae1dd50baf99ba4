"""The command line: one argument grammar (``parse``) and one error path (``run``) for every
command. A mistake is one ``error: <line>`` on stderr and exit 2; nothing heavier than the
run folder's YAML is read before the arguments are known to be right.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from experiments.console import filter_upstream_warnings, pause_gc
from experiments.errors import UserError, exit_with, find_user_error
from experiments.recorded.folder import BOOLEANS, TRUST_MODIFIED, boolean
from experiments.secrets import check_args

FOLDER = "run_dir"
HELP = ("-h", "--help", "help")


def parse(
    argv: Sequence[str],
    own: dict[str, Any],
    usage: str,
    *,
    overrides: bool = True,
    many: bool = False,
) -> tuple[dict, list[str]]:
    """Split a command's arguments into its own options and config overrides: ``-h``,
    ``--help`` or ``help`` prints ``usage``; a run or sweep folder comes positionally or as
    ``run_dir=``; ``key=value`` (also ``--key=value``, ``--key value``) sets an own option;
    any other ``key=value`` (or ``+key=value``) is an override of the run's saved config;
    ``trust_modified=true|false`` is checked here and passed on with the overrides
    (``SavedRun`` takes it out again), so no command carries it.

    Args:
        argv: the arguments after the program name.
        own: the command's own keys and their defaults (``None`` = required). A key whose
            default is ``"false"`` or ``"true"`` is a flag: ``--key`` alone sets it true.
        usage: printed for ``-h`` / ``--help`` (then exit 0).
        overrides: whether other ``key=value`` arguments change the run's config; if not,
            they are refused.
        many: ``run_dir`` takes several folders (a list), positionally or repeated.

    Returns:
        ``(options, overrides)``: ``own`` updated from ``argv``, and the rest in order.
    """
    if any(a in HELP for a in argv):
        print(usage)
        sys.exit(0)
    check_args(list(argv))  # one secret rule for every command line
    options, rest, folders = dict(own), [], []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg.startswith("--") and arg != "--":
            key, sep, value = arg[2:].partition("=")
            if key not in own:
                raise UserError(f"unknown option --{key} (options: {_names(own)})")
            if not sep:
                flag = str(own[key]).lower() in BOOLEANS
                value = "true" if flag else (args.pop(0) if args else "")
            arg = f"{key}={value}"
        key, sep, value = arg.partition("=")
        if not sep and not arg.startswith("-") and arg not in own:  # `ckpt`: a value forgotten
            folders.append(arg)  # the run or sweep folder, given positionally
        elif not sep or not key.strip():
            raise UserError(f"argument {arg!r} is not key=value (see --help)")
        elif key == FOLDER and FOLDER in own:
            folders.append(value)
        elif key in own:
            # `key=` (an unset shell variable) keeps a required option missing
            options[key] = value if value or own[key] is not None else None
        elif key == TRUST_MODIFIED:
            rest.append(f"{TRUST_MODIFIED}={str(boolean(key, value)).lower()}")
        elif overrides:
            rest.append(arg)
        else:
            raise UserError(f"unknown option {key!r} (options: {_names(own)})")
    if folders:
        if FOLDER not in own or (len(folders) > 1 and not many):
            raise UserError(f"one run folder is expected, got {' '.join(folders)} (see --help)")
        options[FOLDER] = folders if many else (folders[0] or None)
    missing = [k for k, v in options.items() if v is None]
    if missing:
        raise UserError(f"missing {', '.join(f'{k}=<...>' for k in missing)} (see --help)")
    return options, rest


def _names(own: dict) -> str:
    return ", ".join(f"{k}=" for k in own)


def run(body: Callable[[list[str]], int | None], argv: Sequence[str] | None = None) -> None:
    """Run ``body(argv)`` as an entry point: a UserError is one ``error:`` line and exit 2
    (1 for a tampered run), an int is the exit code, and output piped into ``head`` that
    closes early is not an error."""
    logging.basicConfig(level=logging.INFO, datefmt="%H:%M:%S",
                        format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")  # fmt: skip
    filter_upstream_warnings()
    pause_gc()  # the worker calls resume_gc once its start-up is over
    try:
        code = body(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return
    except Exception as err:
        user_error = find_user_error(err)
        if user_error is None:
            raise
        exit_with(user_error)
    if code:
        sys.exit(code)
