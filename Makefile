# pi2: one entry point for setting up, building, testing and demoing.
#   make setup   virtualenv + editable install + OS packages + native build
#   make test    native unit tests (host + arm64 under qemu) and pytest (sets up first when needed)
#   make test-fast   the fast lane: pytest without the tests marked slow (about a minute), after `make engine`
#   make lint    ruff
#   make test-sanitize   native tests + engine runs under ASan+UBSan (build/asan)
#   make fuzz    bounded fuzz run of the engine's readers under ASan+UBSan (FUZZ_SECONDS, default 120),
#                then the host's parsers under hypothesis (a quarter of FUZZ_SECONDS)
#   make engine  build native/ for this host
#   make demo    the main job end to end on this machine
#   make clean   remove build outputs (keeps ~/.cache/pi2)

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PI2    := $(VENV)/bin/pi2
BUILD  := build/host
JOBS   ?= $(shell nproc 2>/dev/null || echo 2)

# Tools the build needs and the Debian packages that provide them.
APT_TOOLS := cmake:cmake ninja:ninja-build gcc:gcc g++:g++ aarch64-linux-gnu-gcc:gcc-aarch64-linux-gnu \
             aarch64-linux-gnu-g++:g++-aarch64-linux-gnu qemu-aarch64:qemu-user chromium:chromium git:git

.PHONY: setup test test-fast test-python test-native test-arm64 test-sanitize fuzz lint engine llamacpp demo clean os-packages

setup: os-packages $(VENV)/.installed engine llamacpp

# The llama.cpp baseline from its pinned source, cached in ~/.cache/pi2 (minutes the first time).
llamacpp: $(VENV)/.installed
	$(PI2) build --engine llama.cpp -j $(JOBS)

os-packages:
	@missing=""; for pair in $(APT_TOOLS); do tool=$${pair%%:*}; pkg=$${pair##*:}; \
	  command -v $$tool >/dev/null 2>&1 || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing OS packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" -eq 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null \
	    || { echo "could not install:$$missing (install them and re-run make setup)"; exit 1; }; \
	fi

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

engine:
	cmake -S native -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

test: setup test-native test-arm64 test-python

test-native: engine
	ctest --test-dir $(BUILD) --output-on-failure

# arm64 cross build, unit tests under qemu-aarch64 on three CPUs (i8mm, dotprod, plain NEON fallback)
test-arm64:
	PI2_JOBS=$(JOBS) sh native/tests/run-arm64.sh build/arm64

# ASan+UBSan build: native unit tests, sparse generates under a budget, a failing neuron read, crafted
# files (native/tests/run-sanitize.sh; docs/FUZZ.md). Then pi2-fuzz on every target from that build.
ASAN_BUILD   := build/asan
FUZZ_SECONDS ?= 120
FUZZ_SEED    ?= 1
test-sanitize: $(VENV)/.installed
	PI2_JOBS=$(JOBS) sh native/tests/run-sanitize.sh $(ASAN_BUILD) $(PY)

fuzz: $(VENV)/.installed
	cmake -S native -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPI2_SANITIZE=ON >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	sh native/fuzz/run-fuzz.sh $(ASAN_BUILD) $(FUZZ_SECONDS) $(FUZZ_SEED) $(PY)
	$(PY) tests/fuzz_host.py --seconds $$(( $(FUZZ_SECONDS) / 4 )) --seed $(FUZZ_SEED) --findings $(ASAN_BUILD)/fuzz/findings/host

# --durations: the slowest tests in every log, so a test that starts building or waiting shows itself
test-python: $(VENV)/.installed
	$(PY) -m pytest -q --durations=15

# The fast lane while working: every module's quick checks, without the tests marked slow (real-model
# runs, llama.cpp, servers, bigger synthetic models; the `slow` marker in pyproject.toml says which).
# `make test` (what CI runs) still runs everything.
test-fast: $(VENV)/.installed engine
	$(PY) -m pytest -q -m "not slow" --durations=15

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The main job end to end on this machine: a small synthetic sparse model (TurboSparse-Mistral shapes
# scaled down, dReLU, measured sparsity), pi2 against the baselines on the same weights, prompts and
# lengths, twice: in memory (pi2 vs llama.cpp), and under a memory budget the model does not fit in
# (pi2 vs LLM in a Flash vs llama.cpp, one cgroup each, page cache counted). Then the comparison table
# and a report. Everything lands in build/demo (results kept out of results/).
DEMO := build/demo
DEMO_MODEL := $(DEMO)/model/model.pi2
DEMO_BUDGET ?= 150M
DEMO_RUN = --model $(DEMO_MODEL) --workload multi-turn --limit 2 --n-gen 32 --threads $(JOBS) --results-dir $(DEMO)/results
demo: setup
	$(PI2) models synth --like turbosparse-mistral-7b --layers 8 --hidden 1024 --ffn 8192 --no-dense-down --out $(DEMO)/model
	@echo "== in memory: the whole model resident in every engine =="
	$(PI2) bench $(DEMO_RUN) --engine pi2 --engine llama.cpp
	@echo "== under a $(DEMO_BUDGET) budget: the model does not fit (same cgroup for every engine) =="
	$(PI2) bench $(DEMO_RUN) --engine pi2 --engine llmflash --engine llama.cpp --memory-budget $(DEMO_BUDGET)
	$(PI2) compare --results-dir $(DEMO)/results --baseline llama.cpp
	$(PI2) report --results-dir $(DEMO)/results --out $(DEMO)/report
	@echo "report: $(DEMO)/report/index.html ($(DEMO)/report/report.md)"

clean:
	rm -rf build .pytest_cache .ruff_cache
