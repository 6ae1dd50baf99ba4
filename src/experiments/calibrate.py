"""``python -m experiments.calibrate``: its parser is ``cli.commands.calibrate`` (``--help``)."""

from experiments.cli.commands import calibrate as main

if __name__ == "__main__":
    main()
