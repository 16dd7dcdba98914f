# qwen35-spark: every entry point an operator or CI uses. `make setup && make test` on a fresh machine.
# The newest Python 3.10+ on PATH (pulumi needs 3.10; macOS's stock python3 is 3.9).
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3.10 python3; do \
	  command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null \
	  && { echo $$p; break; }; done)
VENV   := .venv
PY     := $(VENV)/bin/python
# python3-venv: Debian's python3 cannot make a virtualenv without it.
LAB_DEBS := python3-venv docker.io openssh-server busybox-static debootstrap iproute2 ca-certificates xz-utils shellcheck rsync prometheus

.PHONY: setup venv lab-packages test lint unit labtest releasetest enginetest engine up down lab-up lab-down lab-status lab-fetch bench status clean

# `make status STACK=dev` (add STATUS_ARGS=--json for scripts): the deployed cluster against its stack file.
STACK ?= dev
STATUS_ARGS ?=

# Debian packages first (they include python3-venv), then the virtualenv.
setup: lab-packages venv

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt
	@test -n "$(PYTHON)" || { echo "setup: no Python 3.10+ found: install one (e.g. python3.12) and run make setup again" >&2; exit 1; }
	@# A venv left broken by an earlier failed run (no pip, or too old a Python) is made again.
	@$(PY) -c 'import sys, pip; sys.exit(sys.version_info < (3, 10))' 2>/dev/null || { rm -rf $(VENV); $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

# The lab needs Debian packages. Install them only where that is possible (Debian/Ubuntu, as root);
# elsewhere say what the lab tests need and leave the Python setup standing.
lab-packages:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  missing=$$(for p in $(LAB_DEBS); do \
	    [ $$p = docker.io ] && command -v dockerd >/dev/null 2>&1 && continue; \
	    dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	  if [ -n "$$missing" ]; then \
	    echo "setup: installing Debian packages for the lab: $$missing"; \
	    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; } \
	      || echo "setup: WARNING: could not install $$missing; the lab tests will fail until they are installed"; \
	  else echo "setup: lab packages present ($(LAB_DEBS))"; fi; \
	else \
	  echo "setup: not root on Debian/Ubuntu: the lab tests need, as root on Debian/Ubuntu:"; \
	  echo "       apt-get install $(LAB_DEBS)"; \
	  echo "       (unit tests run without them: make unit)"; \
	fi
	@command -v go >/dev/null 2>&1 || command -v pulumi >/dev/null 2>&1 \
	  || echo "setup: the engine tier (make engine, make up) needs Go 1.26+ to build the Pulumi CLI, or a pulumi v3.274.1+ on PATH"

# The unit and release tiers run beside the lab and engine tiers at the lowest priority, and `make engine`
# and `make lab-fetch` beside the lab tier (tests/tiers.py says why); their output follows, and any
# tier's failure fails `make test`.
test: lint venv
	$(PY) -m tests.tiers $(MAKE)

# Shell scripts shipped to nodes must pass shellcheck (the node programs are Python today: none yet).
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@scripts=$$(find components/node_programs patches -name '*.sh' 2>/dev/null); \
	  if [ -n "$$scripts" ]; then command -v shellcheck >/dev/null || { echo "lint: install shellcheck (make setup)" >&2; exit 1; }; \
	  shellcheck $$scripts; fi

unit: venv
	$(PY) -m pytest -q tests/unit

labtest: venv
	$(PY) -m pytest -q tests/lab

# Real vLLM releases (0.14.0, 0.17.1) with their torch from PyPI run patches/prove_model.py. The venvs
# live in $${QWEN35_CACHE:-~/.cache/qwen35-spark}/release: ~10 GB and minutes each, made by the first run.
releasetest: venv
	$(PY) -m pytest -q --durations=0 tests/release

# The Pulumi CLI, our language host and the Docker provider, built from their Go modules (engine/*/go.mod)
# into $${QWEN35_CACHE:-~/.cache/qwen35-spark}/engine once (a cold build takes minutes), or a pulumi on PATH.
engine: venv
	$(PY) -m engine build

# The real CLI against the lab (tests/engine/): preview, up, refresh, destroy, day two.
enginetest: venv engine
	$(PY) -m pytest -q --durations=5 tests/engine

# The program deployed onto lab nodes node-a and node-b by the real engine (stack `lab`), and undone.
up: venv
	$(PY) -m engine up

down: venv
	$(PY) -m engine down

lab-up: venv
	$(PY) -m lab up

lab-down: venv
	$(PY) -m lab down

lab-status: venv
	$(PY) -m lab status

# What the lab downloads or debootstraps (wheels, root filesystems, trixie's Docker), made once into the
# cache; `make test` runs it beside the lab tier so a fresh machine downloads while tests run.
lab-fetch: venv
	$(PY) -m lab fetch

bench: venv
	$(PY) -m bench

status: venv
	$(PY) -m status --stack $(STACK) $(STATUS_ARGS)

clean:
	@if [ "$$(id -u)" = 0 ] && [ -x $(PY) ]; then $(PY) -m lab down || true; fi
	rm -rf $(VENV) .pytest_cache .ruff_cache
