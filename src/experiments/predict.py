"""``python -m experiments.predict``: its parser is ``cli.commands.predict`` (``--help``)."""

from experiments.cli.commands import predict as main

if __name__ == "__main__":
    main()
