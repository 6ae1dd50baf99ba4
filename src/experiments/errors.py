"""The one exception type for user mistakes: the CLI prints it as a single line."""

import sys


class UserError(Exception):
    """A mistake in the user's config, data or command line.

    The entry points catch it and print ``error: <message>`` with no traceback and
    a non-zero exit, so the message must name the key, file or value and what
    would be valid.
    """


def find_in_chain(err: BaseException | None, wanted) -> BaseException | None:
    """The first exception in ``err``'s chain (itself, then its causes and contexts) for
    which ``wanted(exception)`` is true, or None."""
    seen = set()
    while err is not None and id(err) not in seen:
        if wanted(err):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def find_user_error(err: BaseException | None) -> UserError | None:
    """The UserError behind ``err``, if any (Hydra's instantiate wraps what __init__ raises)."""
    return find_in_chain(err, lambda e: isinstance(e, UserError))


def printable_line(value: object, limit: int) -> str:
    """``value`` as text for one line of a message or a card: every character that is not
    printable (a newline, a control, an escape) a space; cut to ``limit`` characters,
    ``...`` marking the cut."""
    text = "".join(ch if ch.isprintable() else " " for ch in str(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(err: BaseException, last: bool = False) -> str:
    """One non-empty line of ``err``'s text, without a leading ``UserError: ``.

    ``last=True`` takes the last line: an error raised in a DataLoader worker arrives with
    the worker's traceback in front of it. An empty message gives the exception's name.
    """
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    if not lines:
        return type(err).__name__
    line = lines[-1] if last else lines[0]
    return line.removeprefix("experiments.errors.UserError: ").removeprefix("UserError: ")


def exit_with(err: UserError, code: int = 2) -> None:
    """The one way a user mistake ends a command: ``error: <one line>`` and exit ``code``."""
    code = getattr(err, "exit_code", code)  # e.g. a tampered run (runs.manifest): 1, not 2
    # an error raised in a DataLoader worker arrives with the worker's traceback in front
    print(f"error: {one_line(err, last=True)}", file=sys.stderr)
    sys.exit(code)
