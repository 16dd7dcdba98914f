# qwen35-spark: every entry point an operator or CI uses. `make setup && make test` on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
LAB_DEBS := docker.io openssh-server busybox-static debootstrap iproute2 ca-certificates xz-utils

.PHONY: setup venv lab-packages test lint unit labtest lab-up lab-down lab-status bench clean

setup: venv lab-packages

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

# The lab needs Debian packages. Install them only where that is possible (Debian/Ubuntu, as root);
# elsewhere say what the lab tests need and leave the Python setup standing.
lab-packages:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  missing=$$(for p in $(LAB_DEBS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	  if [ -n "$$missing" ]; then \
	    echo "setup: installing Debian packages for the lab: $$missing"; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	  else echo "setup: lab packages present ($(LAB_DEBS))"; fi; \
	else \
	  echo "setup: not root on Debian/Ubuntu: the lab tests need, as root on Debian/Ubuntu:"; \
	  echo "       apt-get install $(LAB_DEBS)"; \
	  echo "       (unit tests run without them: make unit)"; \
	fi

test: lint unit labtest

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

unit: venv
	$(PY) -m pytest -q tests/unit

labtest: venv
	$(PY) -m pytest -q tests/lab

lab-up: venv
	$(PY) -m lab up

lab-down: venv
	$(PY) -m lab down

lab-status: venv
	$(PY) -m lab status

bench: venv
	$(PY) -m bench

clean: lab-down
	rm -rf $(VENV) .pytest_cache .ruff_cache
