"""The one exception type for user mistakes: the CLI prints it as a single line."""


class UserError(Exception):
    """A mistake in the user's config, data or command line.

    The entry points catch it and print ``error: <message>`` with no traceback and
    a non-zero exit, so the message must name the key, file or value and what
    would be valid.
    """
