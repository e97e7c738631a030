# Included first by examples/Makefile and examples/nightly.mk: where the recipes find the farm-*
# tools and Python, so that they run from a shell without an activated environment (a new user
# after `make install`, cron).
#
#   VENV (default: the project's .venv, which `make install` creates): when it holds the tools,
#   its bin/ goes first on PATH for every recipe, so `farm-split` and `python` are its own.
#   VENV=/path/to/env uses another environment; VENV= (empty) leaves PATH as it is (an activated
#   environment, or tools installed elsewhere).

FARMKIT_ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST)))..)
VENV ?= $(FARMKIT_ROOT)/.venv

ifneq ($(and $(VENV),$(wildcard $(VENV)/bin/farm-split)),)
export PATH := $(abspath $(VENV))/bin:$(PATH)
endif

# No tools in VENV nor on PATH: every recipe would stop with "farm-split: No such file or
# directory" (Error 127); say what to do instead, once, before any work.
ifeq ($(strip $(foreach folder,$(subst :, ,$(PATH)),$(wildcard $(folder)/farm-split))),)
ifeq ($(filter clean,$(MAKECMDGOALS)),)
ifneq ($(findstring n,$(firstword -$(MAKEFLAGS))),n)
$(error no farm-* tools: none in VENV=$(VENV) nor on PATH; run `make install` in $(FARMKIT_ROOT) (it creates .venv, which the recipes then use), or set VENV=DIR to an environment where farmkit is installed)
endif
endif
endif
