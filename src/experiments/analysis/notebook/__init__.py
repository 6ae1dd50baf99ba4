"""The lab notebook: every run folder under an outputs folder as one table (an index cached
beside the runs), queried as a pandas DataFrame (``experiments.find_runs``), tagged and noted
in the run folder itself, and shown as one self-contained HTML page. No server, no database.

Modules: ``annotate`` (tags and notes in the run folder), ``index`` (finding and reading run
folders, the mtime/size cache), ``query`` (the ``where`` language and the DataFrame),
``report`` and ``page`` (the HTML page); the command is ``cli.lab_notebook``."""
