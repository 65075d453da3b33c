# The two set-up commands of the README.
#   make demo   install traceflow and trace the bundled example (no cluster needed)
#   make test   install everything the tests need (system packages too) and run them all
PYTHON ?= python3
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES = openvswitch-switch iproute2 iptables nftables conntrack ipset \
               openssh-server openssh-client chromium chromium-driver

.PHONY: install demo test system-deps benchmark completions

install:
	$(PYTHON) -m pip install -q -e .

demo: install
	traceflow demo

system-deps:
	@if command -v apt-get >/dev/null 2>&1; then \
	    $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	    $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	        --no-install-recommends $(APT_PACKAGES) >/dev/null; \
	else echo "no apt-get: install $(APT_PACKAGES) yourself; tests needing them skip"; fi

test: system-deps
	$(PYTHON) -m pip install -q -e '.[test]'
	$(PYTHON) -m pytest -q

benchmark: install
	$(PYTHON) benchmarks/run.py

completions:
	$(PYTHON) -m traceflow.completion completions
