# Scheduled re-evaluation: every checkpoint folder of a training run, judged against a reference,
# one night after another, paying only for what is new.
#
#   make -f nightly.mk CHECKPOINTS=runs/ppo-checkpoints PROMPTS=val.jsonl REFERENCE=reference.jsonl
#
# A checkpoint is a subfolder of $(CHECKPOINTS) holding config.json (farmkit's trainers write their
# folders whole, so a half-written one is never seen). Each night:
#
#   CHECKPOINTS/NAME ── farm-sample ──> $(OUT)/outputs/NAME.jsonl          only for new checkpoints
#   outputs + REFERENCE ── farm-annotate --cache ──> $(OUT)/annotations/NAME.jsonl
#                                                   only for new outputs (or a changed reference)
#   every annotations file ── farm-winrate --history ──> one timestamped row per checkpoint
#                                                      appended to $(HISTORY)
#   $(HISTORY) ── farm-plot history ──> $(OUT)/history.png   (each checkpoint's win rate over time)
#
# make decides what is new from the files under $(OUT); the verdict cache ($(CACHE)) makes a
# re-annotation (a changed reference; or a changed POOL after `rm -r $(OUT)/annotations`) pay only
# for pairs no judge has seen. The farm-* tools come from the project's .venv (venv.mk), else cron's PATH.
# A crontab line (02:30 every night; flock keeps two nights from overlapping):
#
#   30 2 * * * cd /path/to/farmkit && flock -n /tmp/farmkit-nightly.lock \
#       make -f examples/nightly.mk CHECKPOINTS=... PROMPTS=... REFERENCE=... >> nightly.log 2>&1
#
# With paid judges, BATCH=submit sends each night's new questions through the Batch API at half the
# price (farm-annotate --batch --batch-mode submit): a checkpoint's annotations are written the
# night its batch is collected (exit 75 in between: make goes on, and tonight's board holds the
# checkpoints that are done). LEDGER (default $(OUT)/spend.jsonl) books every farm-annotate run; `farm-winrate --ledger`
# totals it by day and judge.

include $(dir $(lastword $(MAKEFILE_LIST)))venv.mk

CHECKPOINTS ?= checkpoints
PROMPTS ?= prompts.jsonl
REFERENCE ?= reference.jsonl
POOL ?= sim_eval_offline
OUT ?= nightly
CACHE ?= $(OUT)/annotations.sqlite
HISTORY ?= $(OUT)/history.jsonl
BOOTSTRAP ?= 1000
SEED ?= 0
TEMPERATURE ?= 0.7
MAX_NEW_TOKENS ?= 300
SAMPLE_OPTS ?=
ANNOTATE_OPTS ?=
BATCH ?=
LEDGER ?= $(OUT)/spend.jsonl

# the checkpoints present tonight: every subfolder with a config.json
NAMES := $(sort $(patsubst $(CHECKPOINTS)/%/config.json,%,$(wildcard $(CHECKPOINTS)/*/config.json)))
OUTPUTS := $(NAMES:%=$(OUT)/outputs/%.jsonl)
ANNOTATIONS := $(NAMES:%=$(OUT)/annotations/%.jsonl)

.PHONY: night annotations
.DELETE_ON_ERROR:

# the outputs are named here so that make keeps them (a file only a pattern rule names would be
# deleted as intermediate)
night: $(OUTPUTS) $(ANNOTATIONS)
ifeq ($(NAMES),)
	@echo "nightly: no checkpoint folder with a config.json in $(CHECKPOINTS); nothing to evaluate" >&2
else
	@# with BATCH, a checkpoint whose questions are pending has no annotations file yet
	@done="$$(ls $(ANNOTATIONS) 2>/dev/null)"; \
	if [ -z "$$done" ]; then echo "nightly: every checkpoint's questions are pending in batches" >&2; else \
	farm-winrate $$done --bootstrap $(BOOTSTRAP) --seed $(SEED) --history $(HISTORY) \
		-o $(OUT)/leaderboard.jsonl && farm-plot history $(HISTORY) -o $(OUT)/history.png; fi
endif

annotations: $(OUTPUTS) $(ANNOTATIONS)

# a checkpoint is sampled once: its outputs file depends on nothing that changes after it is written
$(OUT)/outputs/%.jsonl: $(CHECKPOINTS)/%/config.json $(PROMPTS)
	@mkdir -p $(@D)
	farm-sample $(CHECKPOINTS)/$* $(PROMPTS) -n 1 --generator $* --temperature $(TEMPERATURE) \
		--max-new-tokens $(MAX_NEW_TOKENS) --seed $(SEED) $(SAMPLE_OPTS) -o $@

$(OUT)/annotations/%.jsonl: $(OUT)/outputs/%.jsonl $(REFERENCE)
	@mkdir -p $(@D)
	farm-annotate $< --reference $(REFERENCE) --skip-missing --pool $(POOL) --cache $(CACHE) \
		--seed $(SEED) --ledger $(LEDGER) $(if $(BATCH),--batch --batch-mode $(BATCH)) $(ANNOTATE_OPTS) -o $@ \
		$(if $(BATCH),|| [ $$? -eq 75 ])
