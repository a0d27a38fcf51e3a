# The kit's entry points for humans and CI. `make setup` builds the controller
# environment; `make test` is the whole test command (lint, syntax, pytest).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# The controller's Python (PYTHON=... names another): the distribution's own where
# ansible-core 2.19 supports its version and it can make a venv, else python3 from PATH.
# Distributions build theirs with profile-guided and link-time optimization, which a Python
# built from source (pyenv's default) lacks: on a 2-core machine ansible-playbook, ansible-lint
# and the analysis took about a fifth less CPU on Debian 12's 3.11 than on a pyenv 3.11
# (docs/testing.md has the figures). On Linux only: macOS's /usr/bin/python3 is a stub that
# offers to install Apple's developer tools.
SYSTEM_PYTHON ?= $(if $(filter Linux,$(shell uname -s)),/usr/bin/python3)
VENV := .venv
BIN := $(VENV)/bin
# make test's timings: each phase's wall time and pytest's slowest tests.
TIMINGS := .test-timings
# pytest-xdist: three workers, each taking whole files (module-scoped hosts and simulators are
# made once), in tests/conftest.py's DEALING_ORDER; make test and make test-unit share it.
PYTEST_WORKERS := -n 3 --dist loadfile --no-loadscope-reorder
# The controller environment is two locks made together by `make lock`: requirements.lock, what
# deploy, plan, benchmark and the analysis need, and requirements-dev.lock, what tests and lint
# add. `make setup LOCKS=requirements.lock` makes an environment that only deploys.
LOCKS ?= requirements.lock requirements-dev.lock
# Holds the locks the venv was built from: `make setup` compares contents, not times, so a
# second run is a no-op and a change of lock or of LOCKS rebuilds.
STAMP := $(VENV)/.installed-locks
# ansible-core 2.19 supports controllers on these; the locks are made and checked for all three.
CONTROLLER_PYTHONS := 3.11 3.12 3.13
ifeq ($(origin PYTHON),undefined)
ifeq ($(SYSTEM_PYTHON),)
PYTHON := python3
else
PYTHON := $(shell $(SYSTEM_PYTHON) -c 'import ensurepip, sys, venv; sys.exit("%d.%d" % sys.version_info[:2] not in sys.argv[1:])' $(CONTROLLER_PYTHONS) >/dev/null 2>&1 && echo $(SYSTEM_PYTHON) || echo python3)
endif
endif
UV_VERSION := 0.13.9
# One lock valid on every supported Python (--universal from the oldest), wheels only, with the
# hashes `pip install --require-hashes` checks. Where Pythons could take different versions of
# a package, the same one is kept for all (fewest), so every controller runs what was tested.
# uv keeps the versions the existing lock holds; `make lock UV_FLAGS=--upgrade` moves them.
UV_COMPILE = pip compile --quiet --universal --python-version $(firstword $(CONTROLLER_PYTHONS)) \
  --fork-strategy fewest --generate-hashes --no-build --custom-compile-command 'make lock' $(UV_FLAGS)
ROOT_PLAYBOOKS := deploy_kimi.yml benchmark_kimi.yml plan.yml teardown.yml diagnose.yml
INVENTORIES := $(sort $(wildcard inventory/*/hosts.yml))
# Debian packages the tests need: sshd and ip(8) build the namespace test hosts, whose
# Python must create the weights stage's venv and run Ansible's pip module (pkg_resources);
# git for the git runtime, systemd for `systemd-analyze verify` of the server unit, chromium
# to open the HTML report headless.
TEST_DEBS := openssh-server iproute2 python3-venv python3-setuptools git systemd chromium sudo

CONTRACT_VENV := tests/.state/contract-venv
# Work make test needs done but not soon: it runs when the cores would otherwise idle.
LATER := nice -n 10
# ansible-lint's syntax checks (an ansible-playbook per playbook and role) and the syntax target
# keep what YAML files load to and what templates compile to, as the tests' playbooks do
# (tests/support/controller_site/sitecustomize.py; the results are the same): lint took 50
# CPU-s with them, 75 without.
LINT_CACHES := PYTHONPATH="$(CURDIR)/tests/support/controller_site$${PYTHONPATH:+:$$PYTHONPATH}" \
  KIT_TEST_YAML_DIR="$(CURDIR)/tests/.state/yaml" KIT_TEST_JINJA_CODE_DIR="$(CURDIR)/tests/.state/jinja-code"

# An environment that turns off bytecode caching (PYTHONDONTWRITEBYTECODE) makes every
# ansible-playbook worker compile the kit's filter plugin and module_utils from source at each
# task, and every pytest worker rewrite each test file: the suite ran 15-20% longer with it.
# The caches land in __pycache__ folders, which git ignores.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help setup lock check-lock test test-unit test-deps lint syntax pytest test-contract schema clean-testhosts clean

help:
	@echo "make setup   - create $(VENV) from $(LOCKS) on Python $(CONTROLLER_PYTHONS) (no-op when nothing changed)"
	@echo "make test    - lint, syntax-check every root playbook x inventory, pytest"
	@echo "make test-unit - the unit tests only (no test hosts, no playbooks): the inner loop"
	@echo "make lock    - re-resolve requirements.in and requirements-dev.in into their locks"
	@echo "make check-lock - the locks resolve, from wheels and hashes, on Python $(CONTROLLER_PYTHONS)"
	@echo "make test-contract - launch commands vs the pinned sglang's real parser (CPU-only venv)"
	@echo "make schema  - write docs/schema/{level,run,plan}.schema.json from module_utils/contract/"

# Refuses a Python ansible-core 2.19 does not support, saying what it found and what to do.
define CHECK_PYTHON
import sys
found = "%d.%d" % sys.version_info[:2]
needed = sys.argv[1].split()
if found not in needed:
    names = " or ".join(filter(None, [", ".join(needed[:-1]), needed[-1]]))
    sys.exit(
        f"make setup: the controller needs Python {names} (ansible-core 2.19); found "
        f"{sys.version.split()[0]} at {sys.executable}. {sys.argv[2]}"
    )
endef
export CHECK_PYTHON

# Installs exactly the locks: every file checked against its hash, nothing resolved
# (--no-deps), then anything installed that the locks do not list is removed (a package dropped
# from a lock, a tool installed by hand), so the environment is the one the tests ran with.
# An install that fails removes the venv it left half-built (its packages partly replaced, no
# stamp), so the next run starts clean. Without access to PyPI, pip reads PIP_FIND_LINKS and
# PIP_NO_INDEX from the environment (README, Dependencies: a wheelhouse).
setup:
	@started=$$(date +%s); \
	if cat $(LOCKS) | cmp -s - $(STAMP) 2>/dev/null; then \
	  echo "make setup: $(VENV) is up to date with $(LOCKS)"; exit 0; \
	fi; \
	if [ -x $(BIN)/python ]; then \
	  $(BIN)/python -c "$$CHECK_PYTHON" "$(CONTROLLER_PYTHONS)" "Fix: rm -rf $(VENV), then make setup PYTHON=/path/to/python3.1x."; \
	  $(BIN)/python -m pip --version >/dev/null 2>&1 || { echo "make setup: $(VENV) has no pip (left by a venv that failed to build). Fix: rm -rf $(VENV), then make setup." >&2; exit 1; }; \
	else \
	  $(PYTHON) -c "$$CHECK_PYTHON" "$(CONTROLLER_PYTHONS)" "Fix: install one of them (e.g. apt-get install python3.12-venv) and run make setup PYTHON=python3.12, or its path."; \
	  $(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); echo "make setup: $(PYTHON) -m venv failed (on Debian and Ubuntu its venv module comes apart: python3.X-venv for that Python). Fix: install it, then make setup." >&2; exit 1; }; \
	fi; \
	echo "make setup: installing $(LOCKS) into $(VENV) (Python $$($(BIN)/python -c 'import sys; print(sys.version.split()[0], "from", sys.base_prefix)'))"; \
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps $(addprefix --requirement ,$(LOCKS)) || { \
	  rm -rf $(VENV); \
	  echo "make setup: pip could not install $(LOCKS) (its message is above); removed the half-built $(VENV). Fix: what pip names (no access to the package index: see the README's Dependencies, a wheelhouse), then make setup." >&2; \
	  exit 1; }; \
	norm() { tr A-Z a-z | sed -E 's/[-_.]+/-/g' | LC_ALL=C sort -u; }; \
	extra=$$(LC_ALL=C comm -23 \
	  <($(BIN)/python -m pip list --disable-pip-version-check --format=freeze --exclude pip --exclude setuptools --exclude wheel | sed -E 's/[=@ ].*//' | norm) \
	  <(grep -ohE '^[A-Za-z0-9][A-Za-z0-9._-]*==' $(LOCKS) | sed 's/==$$//' | norm)); \
	if [ -n "$$extra" ]; then \
	  echo "removing what $(LOCKS) do not list:" $$extra; \
	  $(BIN)/python -m pip uninstall --quiet --disable-pip-version-check --yes $$extra; \
	fi; \
	$(BIN)/python -m pip check --disable-pip-version-check; \
	cat $(LOCKS) > $(STAMP); \
	echo "make setup: $(VENV) holds the $$(cat $(LOCKS) | grep -cE '^[A-Za-z0-9][A-Za-z0-9._-]*==') packages of $(LOCKS), hashes checked, in $$(( $$(date +%s) - started )) s"

# Re-resolves both locks with a pinned uv in a throwaway venv: requirements.lock from
# requirements.in, then requirements-dev.lock from requirements-dev.in (which includes
# requirements.in) held to requirements.lock's versions and without the packages it lists.
lock:
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; set -x; \
	$(PYTHON) -m venv "$$tmp/uv"; \
	"$$tmp/uv/bin/python" -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION); \
	"$$tmp/uv/bin/uv" $(UV_COMPILE) --output-file requirements.lock requirements.in; \
	"$$tmp/uv/bin/uv" $(UV_COMPILE) --constraint requirements.lock \
	  $$(grep -oE '^[A-Za-z0-9][A-Za-z0-9._-]*==' requirements.lock | sed 's/==$$//; s/^/--no-emit-package /') \
	  --output-file requirements-dev.lock requirements-dev.in

# Each lock resolves on each supported Python from wheels whose hashes it lists, its closure
# complete (tests/unit/test_controller_lock.py; make test runs it with the other unit tests).
# Needs the package index.
check-lock: setup
	$(BIN)/pytest tests/unit/test_controller_lock.py -q -p no:cacheprovider

# Lint and the syntax checks run beside pytest, at a lower priority (LATER): they take the CPU
# pytest's waiting leaves idle, and pytest's tests, which wait on hosts and servers, go first.
# Each one's output comes out in lines, and any failure fails the target.
# It ends with the 20 slowest tests and each phase's wall time (tests/support/timings.py).
test: setup test-deps
	@rm -rf $(TIMINGS) && mkdir -p $(TIMINGS)
	@start=$$(date +%s); status=0; \
	$(MAKE) --no-print-directory -j3 --output-sync=line lint syntax pytest || status=$$?; \
	$(BIN)/python -m tests.support.timings $(TIMINGS)/pytest.json $$(cat $(TIMINGS)/*.phase 2>/dev/null) \
	  --phase total=$$(( $$(date +%s) - start )); \
	exit $$status

# The inner loop: modules, module_utils, analysis, simulator and hub, without test hosts.
# Most of its tests wait (simulators, deadlines), so three workers on two cores took 212 s
# where one took 536 s, for the same CPU.
test-unit: setup
	$(BIN)/pytest tests/unit tests/contract -q $(PYTEST_WORKERS)

# Installs only what is missing, so it is quiet and fast on a prepared machine.
test-deps:
	@missing=""; for p in $(TEST_DEBS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "The tests need these Debian packages:$$missing (run as root or install them)"; exit 1; fi; \
	  echo "installing:$$missing"; apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

lint: setup
	@mkdir -p $(TIMINGS) && date +%s > $(TIMINGS)/lint.start
	$(LATER) $(BIN)/yamllint --strict .
	$(LATER) $(BIN)/ruff check .
	$(LATER) $(BIN)/ruff format --check .
	PATH="$(CURDIR)/$(BIN):$$PATH" $(LINT_CACHES) $(LATER) $(BIN)/ansible-lint --profile production
	@echo "--phase lint=$$(( $$(date +%s) - $$(cat $(TIMINGS)/lint.start) ))" > $(TIMINGS)/lint.phase

# One ansible-playbook per inventory checks every root playbook: each start costs seconds.
syntax: setup
	@mkdir -p $(TIMINGS) && date +%s > $(TIMINGS)/syntax.start
	@for inv in $(INVENTORIES); do \
	  echo "syntax-check $(ROOT_PLAYBOOKS) -i $$(dirname $$inv)"; \
	  $(LINT_CACHES) $(LATER) $(BIN)/ansible-playbook --syntax-check -i $$(dirname $$inv) $(ROOT_PLAYBOOKS) >/dev/null; \
	done
	@echo "--phase syntax=$$(( $$(date +%s) - $$(cat $(TIMINGS)/syntax.start) ))" > $(TIMINGS)/syntax.phase

# make test's pytest runs on PYTEST_WORKERS. An integration test mostly waits (SSH, the
# simulator's steps, server start-ups): on two workers the suite used 0.55 of a core.
pytest: setup test-deps
	$(BIN)/python -m tests.support.testhosts down --stale
	@mkdir -p $(TIMINGS)
	KIT_TIMINGS_FILE=$(TIMINGS)/pytest.json $(BIN)/pytest $(PYTEST_WORKERS)

# The launch-command contract against the real parser of the pinned sglang, in a CPU-only venv
# holding sglang and only what its argument parsing imports (tests/contract/README.md). Every
# cross-check must run: a skip fails the target, and so does a stale committed snapshot.
test-contract:
	$(PYTHON) tests/contract/contract_venv.py
	@log=$$(mktemp); trap 'rm -f "$$log"' EXIT; \
	KIT_REQUIRE_REAL_SGLANG=1 $(CONTRACT_VENV)/bin/python -m pytest tests/contract -p no:cacheprovider -rs | tee "$$log"; \
	if grep -qE '(^SKIPPED|[0-9]+ skipped)' "$$log"; then echo "test-contract: tests were skipped; every cross-check must run"; exit 1; fi

# The committed schemas, written from their data (module_utils/contract/schema_files.py): the
# level file's summary comes from the metric registry. A unit test fails when a committed file
# differs from what this writes.
schema: setup
	$(BIN)/python -c 'import module_utils; from ansible.module_utils.contract import schema_files; print("\n".join(schema_files.write("docs/schema")))'

# Removes test hosts left by an interrupted test run (namespaces, processes, files).
clean-testhosts: setup
	$(BIN)/python -m tests.support.testhosts down --all

clean: clean-testhosts
	rm -rf $(VENV) plan .pytest_cache .ruff_cache $(TIMINGS)
