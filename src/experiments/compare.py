"""``python -m experiments.compare``: its parser is ``cli.commands.compare`` (``--help``)."""

from experiments.cli.commands import compare as main

if __name__ == "__main__":
    main()
