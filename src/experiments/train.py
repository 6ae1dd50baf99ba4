"""``python -m experiments.train``: its parser is ``cli.commands.train`` (``--help``)."""

from experiments.cli.commands import train as main

if __name__ == "__main__":
    main()
