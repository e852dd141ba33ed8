# localrun: `make demo` and `make test` do all the set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BACKEND ?= cpu            # cpu (safe on any x86-64), cpu-exact, cuda or metal: see scripts/build_llama_cpp.sh
PY := $(VENV)/bin/python
DEMO_MODEL ?= smollm2
DEMO_PROMPT ?= What is the capital of France? Answer in one sentence.

.PHONY: install install-test demo test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(VENV)/.llama-$(strip $(BACKEND)): $(PY) pyproject.toml scripts/build_llama_cpp.sh
	bash scripts/build_llama_cpp.sh $(strip $(BACKEND)) $(VENV)
	touch $@

# compileall: an editable install leaves our own modules uncompiled, and where PYTHONDONTWRITEBYTECODE is set
# (as on CI) every command would compile them again on start (a tenth of a second each time).
install: $(VENV)/.llama-$(strip $(BACKEND))
	$(PY) -m pip install --quiet -e .
	$(PY) -m compileall -q src

# The browser tests drive Chromium through Playwright (CORS, the chat page): Debian's, installed here where it is
# missing and this is root (CI), since Playwright's own download needs its CDN; elsewhere they skip and say why.
install-test: $(VENV)/.llama-$(strip $(BACKEND)) $(VENV)/.llama-tools
	$(PY) -m pip install --quiet -e '.[test,plot]'
	$(PY) -m compileall -q src
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; fi

# llama.cpp's own llama-bench, llama-perplexity and llama-batched-bench (the references the tests compare
# against), built once from the same vendored source and flags and cached in ~/.cache/localrun.
$(VENV)/.llama-tools: $(PY) pyproject.toml scripts/build_llama_bench.sh scripts/build_llama_cpp.sh
	PYTHON=$(PY) bash scripts/build_llama_bench.sh
	touch $@

demo: install
	$(VENV)/bin/localrun pull $(DEMO_MODEL)
	$(VENV)/bin/localrun run $(DEMO_MODEL) --temperature 0 --max-tokens 64 --verbose "$(DEMO_PROMPT)"

test: install-test
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder

bench: install-test
	$(PY) scripts/bench_startup.py
	$(PY) scripts/bench_decode.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
