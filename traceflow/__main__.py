from traceflow.cli.app import run

run()
