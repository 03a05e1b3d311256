# The two commands a fresh machine needs (see README.md):
#   make demo   install everything, then walk through a claim's life on a real RDMA kernel
#   make test   install everything, then lint, host tests and guest tests on both kernels
VENV   := .venv
PY     := $(VENV)/bin/python
GUEST  := tests/guest/harness

.PHONY: setup kernels lint test test-host test-guest test-guest-7.3 test-guest-6.1 test-systemd demo demo-host bench bench-smoke

setup:
	scripts/bootstrap.sh

kernels: setup
	$(GUEST)/prepare-kernel.sh all

lint: setup
	$(VENV)/bin/ruff check rdmad tests bench
	$(VENV)/bin/ruff format --check rdmad tests bench
	$(VENV)/bin/mypy --strict

test-host: setup
	$(PY) -m pytest tests -ra

test-guest-7.3: kernels
	$(GUEST)/run-guest-tests.sh --kernel 7.3 -ra

test-guest-6.1: kernels
	$(GUEST)/run-guest-tests.sh --kernel 6.1 -ra

test-guest: test-guest-7.3 test-guest-6.1

# rdmad under systemd as PID 1 in a bookworm image: notify, bus policy, journald fields,
# systemd-analyze security.
test-systemd: kernels
	$(GUEST)/run-systemd-check.sh

test: lint test-host test-guest test-systemd bench-smoke

demo: kernels
	scripts/demo.sh --guest

demo-host: setup
	scripts/demo.sh --host

# The full run and the smoke write results.md, results.json, plots and profiles to bench/out/.
bench: setup
	$(PY) -m bench.run

# The benchmark's own unit tests (no root), then every scenario tiny.
bench-smoke: setup
	$(PY) -m pytest bench/tests -q
	$(PY) -m bench.run --smoke
