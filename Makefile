# The two commands a fresh machine needs (see README.md):
#   make demo   install everything, then walk through a claim's life on a real RDMA kernel
#   make test   install everything, then lint, host tests and guest tests on both kernels,
#               the Debian package, and rdmad installed from it under systemd in a guest
VENV   := .venv
PY     := $(VENV)/bin/python
GUEST  := tests/guest/harness

.PHONY: setup bytecode lock deb image kernels lint test test-host test-guest test-guest-7.3 test-guest-6.1 test-systemd demo demo-host bench bench-smoke soak soak-guest

setup:
	scripts/bootstrap.sh

# Re-resolve the dependency locks (requirements/*.txt, with hashes) to the newest versions
# pyproject.toml allows; commit the result. setup installs from requirements/dev.txt.
lock: setup
	requirements/lock.sh
	scripts/bootstrap.sh --no-apt

# build/deb/rdmad_<version>_<arch>.deb (debian/, lintian-checked); a no-op when unchanged
deb: setup
	scripts/build-deb.sh

# build/image/rdmad-dra.oci.tar: rdmad-dra's OCI image, a minimal bookworm (mmdebstrap) with
# the .debs installed, built twice and compared (reproducible); `ctr images import` reads it.
# tests/cri/test_dra_image.py runs it through containerd's CRI.
image: deb
	scripts/build-image.sh --check

kernels: setup
	$(GUEST)/prepare-kernel.sh all

# Python: ruff, mypy. The CNI plugin (Go): gofmt, then vet and its tests through scripts/go.sh
# (the GOPATH mode it is built in).
lint: setup
	$(VENV)/bin/ruff check rdmad testbed tests bench
	$(VENV)/bin/ruff format --check rdmad testbed tests bench
	$(VENV)/bin/mypy --strict
	@unformatted=$$(gofmt -l cni) && [ -z "$$unformatted" ] \
		|| { echo "gofmt -l cni: not gofmt-formatted:" $$unformatted; exit 1; }
	scripts/go.sh vet .
	if ls cni/*_test.go >/dev/null 2>&1; then scripts/go.sh test .; fi

# The fast loop while working on the code: lint, then every test in tests/ and bench/tests that
# needs none of root, a bus, the guest, podman or containerd (the markers the fixtures that
# provide them set: tests/conftest.py), in under a minute. It only uses the .venv that
# `make setup` made: no apt, no root, no capability, no build. `make test` is the whole proof.
NEEDS_NOTHING := not root and not bus and not guest and not podman and not containerd
.PHONY: check
check:
	@[ -x $(PY) ] || { echo "make check: no $(VENV) here. Make it once with 'make setup'" \
		"(root: apt packages too) or 'scripts/bootstrap.sh --no-apt' (no root)." >&2; exit 2; }
	$(VENV)/bin/ruff check rdmad testbed tests bench
	$(VENV)/bin/ruff format --check rdmad testbed tests bench
	$(VENV)/bin/mypy --strict
	@# pytest's tmp dirs on tmpfs: tests that save claims or write CDI specs sync each file,
	@# which on a real disk shared with other work took most of the minute
	tmp=$$(mktemp -d -p /dev/shm rdmad-check.XXXXXX) && trap 'rm -rf "$$tmp"' EXIT && \
		$(PY) -m pytest tests bench/tests -q -m "$(NEEDS_NOTHING)" --basetemp="$$tmp/pytest"

# Byte-code for the checkout, written whatever the caller's PYTHONDONTWRITEBYTECODE says: the
# tests and the benchmark start rdmad, rdmactl and rdmad-dra as processes by the hundred, and
# each would compile every module it imports again (`import rdmad.daemon.main`: 2.8-3.4 s
# without, 0.6-1.1 s with, on this machine under load). A no-op when current. The guest
# runs compile theirs in tests/guest/harness/run-in-guest.sh.
bytecode: setup
	$(PY) -m compileall -q -j0 rdmad testbed tests bench >/dev/null

test-host: setup bytecode
	$(PY) -m pytest tests -ra --durations=15

test-guest-7.3: kernels
	$(GUEST)/run-guest-tests.sh --kernel 7.3 -ra --durations=15

test-guest-6.1: kernels
	$(GUEST)/run-guest-tests.sh --kernel 6.1 -ra --durations=15

test-guest: test-guest-7.3 test-guest-6.1

# rdmad installed from its .deb under systemd as PID 1 in a bookworm image: start at boot,
# notify, bus policy (rdmactl as root and as nobody), polkit's actions, journald fields,
# apt remove/reinstall under a live claim, a CRI pod's RDMA limit under the kubelet's systemd
# cgroup driver, systemd-analyze security, a give-back the kernel refuses at start.
test-systemd: kernels deb
	$(GUEST)/run-systemd-check.sh

# The stages of `make test`, each once, in this order, stopping at the first that fails; then
# one line per stage with its duration (scripts/timed-stages.sh), whether it passed or not.
TEST_STAGES := setup lint deb image test-host kernels test-guest-7.3 test-guest-6.1 \
	test-systemd bench-smoke
test:
	@scripts/timed-stages.sh "$(MAKE)" $(TEST_STAGES)

demo: kernels
	scripts/demo.sh --guest

demo-host: setup
	scripts/demo.sh --host

# The full run and the smoke write results.md, results.json, plots and profiles to bench/out/.
bench: setup
	$(PY) -m bench.run

# The benchmark's own unit tests (no root), then every scenario tiny.
bench-smoke: setup bytecode
	$(PY) -m pytest bench/tests -q
	$(PY) -m bench.run --smoke

# The chaos soak (tests/soak, as root): claims, CNI, podman and faults together on two sim
# nodes, invariants checked at intervals. Not part of `make test` (which runs 60 s of it in
# tests/soak/test_soak.py). A violation prints the seed and the schedule: replay with it.
SOAK_SECONDS ?= 600
soak: setup
	$(PY) -m tests.soak.runner --seconds $(SOAK_SECONDS) $(if $(SOAK_SEED),--seed $(SOAK_SEED)) \
		$(if $(SOAK_PACE),--pace $(SOAK_PACE))

# The soak in the 7.3 guest (QEMU, TCG where there is no KVM), on real rxe devices: one rdmad
# on its kernel backend in RDMA netns mode SOAK_MODE (shared or exclusive; by default chosen
# by the seed, printed first). Not in `make test`: CI has no room for it (docs/reliability.md).
# SOAK_SECONDS as given, 180 s unless given; the schedule played SOAK_PACE (4) times slower
# than the host's, at emulation's pace (docs/reliability.md).
GUEST_SOAK_SECONDS = $(if $(filter file,$(origin SOAK_SECONDS)),180,$(SOAK_SECONDS))
GUEST_SOAK_PACE = $(or $(SOAK_PACE),4)
soak-guest: kernels
	$(GUEST)/run-in-guest.sh --kernel 7.3 --mem 2G \
		--timeout $$(( $(GUEST_SOAK_SECONDS) * ($(GUEST_SOAK_PACE) + 4) + 1500 )) -- \
		env PYTHONDONTWRITEBYTECODE=1 $(PY) -m tests.soak.runner --seconds $(GUEST_SOAK_SECONDS) \
		--rxe $(or $(SOAK_MODE),seed) $(if $(SOAK_SEED),--seed $(SOAK_SEED)) \
		--pace $(GUEST_SOAK_PACE)
