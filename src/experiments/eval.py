"""``python -m experiments.eval``: its parser is ``cli.commands.evaluate`` (``--help``)."""

from experiments.cli.commands import evaluate as main

if __name__ == "__main__":
    main()
