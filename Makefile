# The two set-up commands of the README; both are thin wrappers around ./dev (which works
# without make): a project virtual environment in .venv, because Debian 12 and Ubuntu 24.04
# refuse `pip install` into the system Python (PEP 668).
#   make demo   create .venv, install traceflow in it and trace the bundled example
#   make test   install everything the tests need (system packages too) and run them all
PYTHON ?= python3
VENV ?= .venv
export PYTHON VENV

.PHONY: install demo test system-deps benchmark completions

demo:
	./dev demo

test:
	./dev test

install:
	./dev venv

system-deps:
	./dev deps

benchmark: install
	$(VENV)/bin/python benchmarks/run.py

completions: install
	$(VENV)/bin/python -m traceflow.cli.completion write completions
