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
# a second engine with that store beside the default one and runs the demo there: Debian sid's Engine 28.5
# (containerd 2.1, Buildx 0.29, Compose 2.40; docs/engine-notes.md sections 6 and 7), on its own socket, data root
# and bridge. `make test` starts it too, for the real-engine tests that run on both stores (and on the newer engine).
STORE ?= classic
CONTAINERD_SOCKET := /run/nodekit-engine-sid/containerd/docker.sock
CONTAINERD_ENGINE := --engine sid --store containerd
ifeq ($(STORE),containerd)
export DOCKER_HOST := unix://$(CONTAINERD_SOCKET)
else ifneq ($(STORE),classic)
$(error STORE is classic or containerd, not '$(STORE)')
endif

.PHONY: help venv engine engine-containerd sshd slurm chromium base demo test test-smoke test-unit test-docker test-big reclaim lint format docs bench clean

help:
	@echo "make demo         build the example image and run a 2-node DDP job on this machine"
	@echo "                  (STORE=containerd: on an engine with Docker's containerd image store, Engine 29's default)"
	@echo "make test         lint, then unit + real-Docker + multi-host tests (what CI runs)"
	@echo "make test-smoke   before the full suite: one 2-node up, one code-change push, one 3-host run, one Slurm job (~2.5 min)"
	@echo "make test-unit    the unit tier only (no Docker)"
	@echo "make test-docker  the real-Docker tier only (tests/integration; fails, never skips, without an engine)"
	@echo "make test-big     the real tests too big for make test on 2 cores (marked big; make bench runs them too)"
	@echo "make reclaim      give back the disk earlier test runs left (stale tags, build cache, kept blobs, cluster data)"
	@echo "make lint         ruff + mypy --strict"
	@echo "make docs         the reference pages from the code, then the documentation site in site/ (mkdocs, offline)"
	@echo "make format       ruff format, then ruff's fixes"
	@echo "make bench        nodekit vs bare torchrun, build times, image size, shipping (small and CUDA images; writes docs/benchmarks.md)"
	@echo "make venv         .venv with nodekit and its dev tools"
	@echo "make engine       make a Docker engine with Compose v2 and Buildx reachable (installs one on Debian as root)"
	@echo "make engine-containerd  a second engine with the containerd image store on $(CONTAINERD_SOCKET)"
	@echo "make sshd         install Debian's sshd binary for the multi-host tests (never a service)"
	@echo "make slurm        install Slurm, munge and charliecloud's runtime for the Slurm tests (never a service)"
	@echo "make chromium     install Debian's Chromium and chromedriver for the run report's browser test"
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

# The run report's browser test (tests/integration/test_report_browser.py) starts a headless Chromium through
# chromedriver; this only installs Debian's chromium and chromium-driver.
chromium:
	bash scripts/chromium.sh

base: venv engine
	$(NODEKIT) base --if-missing --config $(DEMO)/nodekit.toml

demo: venv engine base
	$(PY) examples/demo.py

lint: venv
	$(VENV)/bin/ruff check nodekit tests examples benchmarks
	$(VENV)/bin/ruff format --check nodekit tests examples benchmarks
	$(VENV)/bin/mypy

# The reference pages and the top-level compose/ node files are generated from the code (tests/unit/cli/test_reference.py
# and tests/unit/backends/compose/test_top_level_compose.py fail when they differ from it);
# the site builds offline, --strict: a broken link or anchor fails it. NO_MKDOCS_2_WARNING: Material's banner.
docs: venv
	$(PY) -m nodekit.cli.reference docs/reference
	$(PY) -m tests.compose_examples compose
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

format: venv
	$(VENV)/bin/ruff format nodekit tests examples benchmarks
	$(VENV)/bin/ruff check --fix nodekit tests examples benchmarks

test-unit: venv
	$(VENV)/bin/pytest tests/unit -q -n 4

# The quick real subset (the tests marked smoke): one 2-node `nodekit up` on the real engine, one code-change push,
# one 3-host `nodekit run` over SSH and one Slurm job on the virtual cluster, in three groups side by side (-n 3).
# 137 and 147 s under the heavy lock on 2 busy cores (2026-11-26). Fails instead of skipping without an engine, as
# `make test` does.
test-smoke: venv engine sshd slurm base
	NODEKIT_REQUIRE_DOCKER=1 $(VENV)/bin/pytest tests/integration tests/cluster -m smoke -q -n 3 --dist loadgroup --durations=4

# The real-engine tier alone (builds, 2-node jobs, preflight refusals, packaging): fails instead of skipping when the
# engine is missing, as in `make test`.
test-docker: venv engine engine-containerd base
	$(PY) -m tests.reclaim
	NODEKIT_REQUIRE_DOCKER=1 $(VENV)/bin/pytest tests/integration -q -m "not big" --durations=15

# The real tests that make test leaves out to stay under 30 minutes and the disk of a 2-core CI machine (marked big;
# docs/development.md says which and why). make bench runs them first.
# It also runs the exit-code proof at its full count (20 two-node Lightning runs; make test runs 3 of them).
test-big: venv engine base
	NODEKIT_REQUIRE_DOCKER=1 $(VENV)/bin/pytest tests/integration tests/cluster -q -m big --durations=5
	NODEKIT_REQUIRE_DOCKER=1 NODEKIT_EXIT_CODE_RUNS=20 $(VENV)/bin/pytest -q --durations=1 \
		"tests/integration/test_launch_modes.py::test_an_unmodified_lightning_trainer_exits_0_on_both_nodes_every_time"

# Real-Docker tests fail instead of skipping when the engine is missing (NODEKIT_REQUIRE_DOCKER=1).
# The unit tier runs on 4 workers (pytest-xdist): its tests are isolated (tmp_path, no engine, no fixed port) and
# a third of their time is waiting, so 4 on 2 cores finish sooner than 2. The heavy tiers run as four groups (the
# cluster tests over SSH, the real-engine tier, the other cluster tests, Slurm's) on HEAVY_WORKERS workers, longest
# first (--dist loadgroup, groups and order in tests/conftest.py); inside a group the tests stay serial, in file
# order, as they share one engine's fixed ports or one cluster's namespace names.
# Before the heavy tiers, tests/reclaim.py gives back what earlier runs left (they keep images, build cache, blobs and
# the virtual hosts' data roots between runs, to be faster): it fails here, with the numbers, when the disk still
# lacks the room a full run needs, instead of a test failing part-way with "no space left on device".
HEAVY_WORKERS ?= 2
test: lint engine engine-containerd sshd slurm chromium base
	site=$$(mktemp -d) && NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir "$$site" && rm -rf "$$site"
	$(VENV)/bin/pytest tests/unit -q -n 4 --durations=5
	$(PY) -m tests.reclaim
	NODEKIT_REQUIRE_DOCKER=1 NODEKIT_EXIT_CODE_RUNS=3 $(VENV)/bin/pytest tests/integration tests/cluster -q -m "not big" -n $(HEAVY_WORKERS) --dist loadgroup --durations=30

# make bench: every benchmark, the deciding one (issue 13: phases, intervals, verdicts; 10 runs a side, 30 epochs,
# about 8 minutes) included. make bench DECIDE=1 [DECIDE_ARGS="--reps 10 --epochs 150 --write-docs"]: only that one.
bench: venv engine engine-containerd sshd base
ifdef DECIDE
	$(PY) benchmarks/decide.py $(DECIDE_ARGS)
else
	$(MAKE) test-big
	$(PY) benchmarks/manifest_bench.py
	$(PY) benchmarks/layers_bench.py
	$(PY) benchmarks/link_bench.py
	$(PY) benchmarks/stamp_cost.py
	$(PY) benchmarks/data_bench.py
	$(PY) benchmarks/run.py
	$(PY) benchmarks/decide.py
	$(PY) benchmarks/fleet_bench.py
	$(PY) benchmarks/top_cost.py
	$(PY) benchmarks/ship_bench.py
	$(PY) benchmarks/tree_bench.py
	$(PY) benchmarks/scale16_bench.py
	$(PY) benchmarks/start_cost.py
	$(PY) benchmarks/base_bench.py
	$(PY) benchmarks/cuda_bench.py --phase all
endif

reclaim: venv
	$(PY) -m tests.reclaim

clean:
	rm -rf $(VENV) .nodekit site $(DEMO)/.nodekit $(DEMO)/outputs $(DEMO)/compose
