"""The command line, the top of the pipeline: the typer app and its commands (app.py; the
check/audit/diff commands in questions.py), help conventions and exit codes (help.py,
crash.py), shell completion (completion.py) and inputs as people type them (resolve.py).

Nothing imports this package but ``traceflow/__main__.py`` and the console-script entry
points (``traceflow.cli.app:run``)."""
