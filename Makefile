# The single entry point: CI calls `make test` (through .ci/run); users call `make demo`.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
NODEKIT := $(VENV)/bin/nodekit
DEMO := examples/ddp
# The image store of the engine `make demo` uses: classic (overlay2, what an upgraded host keeps) or containerd
# (Docker's containerd image store, the default of Engine 29 on fresh installs). `make demo STORE=containerd` starts
# a second engine with that store beside the default one (its own socket, data root, no bridge) and runs the demo
# there; `make test` starts it too, for the real-engine tests that run on both stores.
STORE ?= classic
CONTAINERD_SOCKET := /var/run/nodekit-containerd.sock
CONTAINERD_ENGINE := --store containerd --socket $(CONTAINERD_SOCKET) --data-root /var/lib/nodekit-containerd \
	--exec-root /var/run/nodekit-containerd --pidfile /var/run/nodekit-containerd.pid \
	--log /var/log/nodekit-containerd.log -- --bridge=none --iptables=false --ip6tables=false
ifeq ($(STORE),containerd)
export DOCKER_HOST := unix://$(CONTAINERD_SOCKET)
else ifneq ($(STORE),classic)
$(error STORE is classic or containerd, not '$(STORE)')
endif

.PHONY: help venv engine engine-containerd sshd slurm base demo test test-unit test-docker lint format bench clean

help:
	@echo "make demo         build the example image and run a 2-node DDP job on this machine"
	@echo "                  (STORE=containerd: on an engine with Docker's containerd image store, Engine 29's default)"
	@echo "make test         lint, then unit + real-Docker + multi-host tests (what CI runs)"
	@echo "make test-unit    the unit tier only (no Docker)"
	@echo "make test-docker  the real-Docker tier only (tests/integration; fails, never skips, without an engine)"
	@echo "make lint         ruff + mypy --strict"
	@echo "make format       ruff format, then ruff's fixes"
	@echo "make bench        nodekit vs bare torchrun, build times, image size, shipping (small and CUDA images; writes docs/benchmarks.md)"
	@echo "make venv         .venv with nodekit and its dev tools"
	@echo "make engine       make a Docker engine with Compose v2 and Buildx reachable (installs one on Debian as root)"
	@echo "make engine-containerd  a second engine with the containerd image store on $(CONTAINERD_SOCKET)"
	@echo "make sshd         install Debian's sshd binary for the multi-host tests (never a service)"
	@echo "make slurm        install Slurm, munge and charliecloud's runtime for the Slurm tests (never a service)"
	@echo "make base         build nodekit/base:bookworm when it is missing"
	@echo "make clean        remove .venv, .nodekit and the demo's generated files"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

engine:
ifeq ($(STORE),containerd)
	env -u DOCKER_HOST bash scripts/engine.sh
	env -u DOCKER_HOST bash scripts/engine.sh $(CONTAINERD_ENGINE)
else
	bash scripts/engine.sh
endif

engine-containerd:
	env -u DOCKER_HOST bash scripts/engine.sh $(CONTAINERD_ENGINE)

# The fleet tests start Debian's sshd in every virtual host; this only installs the binary (never a service).
sshd:
	bash scripts/sshd.sh

# The Slurm tests start munged, slurmctld and a slurmd per virtual host; this only installs the binaries (slurm-wlm,
# munge, charliecloud-runtime, squashfs-tools, squashfuse), never a service.
slurm:
	bash scripts/slurm.sh

base: venv engine
	$(NODEKIT) base --if-missing --config $(DEMO)/nodekit.toml

demo: venv engine base
	$(PY) examples/demo.py

lint: venv
	$(VENV)/bin/ruff check nodekit tests examples benchmarks
	$(VENV)/bin/ruff format --check nodekit tests examples benchmarks
	$(VENV)/bin/mypy

format: venv
	$(VENV)/bin/ruff format nodekit tests examples benchmarks
	$(VENV)/bin/ruff check --fix nodekit tests examples benchmarks

test-unit: venv
	$(VENV)/bin/pytest tests/unit -q -n 4

# The real-engine tier alone (builds, 2-node jobs, preflight refusals, packaging): fails instead of skipping when the
# engine is missing, as in `make test`.
test-docker: venv engine base
	NODEKIT_REQUIRE_DOCKER=1 $(VENV)/bin/pytest tests/integration -q --durations=15

# Real-Docker tests fail instead of skipping when the engine is missing (NODEKIT_REQUIRE_DOCKER=1).
# The unit tier runs on 4 workers (pytest-xdist): its tests are isolated (tmp_path, no engine, no fixed port) and
# a third of their time is waiting, so 4 on 2 cores finish sooner than 2. The Docker tier and the cluster tier run
# side by side, one worker each (--dist loadgroup, groups set in tests/conftest.py): inside a tier the tests stay
# serial, in file order, as they share one engine's fixed ports or one set of namespace names.
test: lint engine engine-containerd sshd slurm base
	$(VENV)/bin/pytest tests/unit -q -n 4 --durations=5
	NODEKIT_REQUIRE_DOCKER=1 $(VENV)/bin/pytest tests/integration tests/cluster -q -n 2 --dist loadgroup --durations=15

# make bench: every benchmark, the deciding one (issue 13: phases, intervals, verdicts; 10 runs a side, 30 epochs,
# about 8 minutes) included. make bench DECIDE=1 [DECIDE_ARGS="--reps 10 --epochs 150 --write-docs"]: only that one.
bench: venv engine engine-containerd sshd base
ifdef DECIDE
	$(PY) benchmarks/decide.py $(DECIDE_ARGS)
else
	$(PY) benchmarks/manifest_bench.py
	$(PY) benchmarks/run.py
	$(PY) benchmarks/decide.py
	$(PY) benchmarks/fleet_bench.py
	$(PY) benchmarks/ship_bench.py
	$(PY) benchmarks/base_bench.py
	$(PY) benchmarks/cuda_bench.py --phase all
endif

clean:
	rm -rf $(VENV) .nodekit $(DEMO)/.nodekit $(DEMO)/outputs $(DEMO)/compose
