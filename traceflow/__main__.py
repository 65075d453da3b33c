from traceflow.cli import run

run()
