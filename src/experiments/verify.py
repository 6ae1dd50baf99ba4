"""``python -m experiments.verify``: its parser is ``cli.commands.verify`` (``--help``)."""

from experiments.cli.commands import verify as main

if __name__ == "__main__":
    main()
