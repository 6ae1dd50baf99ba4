"""``python -m experiments.export``: its parser is ``cli.commands.export`` (``--help``)."""

from experiments.cli.commands import export as main

if __name__ == "__main__":
    main()
