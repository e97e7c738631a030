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
#
# Drift canaries: CANARIES=pairs.jsonl (a fixed set of pairs: instruction, input, output_1, output_2)
# are asked twice the first night, past the cache (farm-annotate --no-cache, seeds SEED and SEED+1),
# and frozen in $(FROZEN); every later night asks them once more past the cache and
# `farm-winrate --canaries $(FROZEN)` compares tonight's verdicts with the frozen ones (a one-sided
# exact binomial test against the judge's own self-agreement when frozen). The row goes into
# $(HISTORY) and the plot marks a drift; a drift prints one line `farm-winrate: judge drift: ...`,
# and the night ends in failure (farm-winrate exits 4, make says `Error 4` and exits 2) after the
# board and the plot are written. The canaries are asked directly (not in a batch) and booked in the
# ledger like every other question. Their records keep the endpoint's fingerprint where it gives one
# (reply_model, system_fingerprint); a changed one prints `farm-winrate: the judge's fingerprint
# changed: ...` and is marked in the history row (judge_fingerprint_changed), without being a drift.

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
CANARIES ?=
FROZEN ?= $(OUT)/canaries/frozen.jsonl
DRIFT_LEVEL ?= 0.01

# the checkpoints present tonight: every subfolder with a config.json
NAMES := $(sort $(patsubst $(CHECKPOINTS)/%/config.json,%,$(wildcard $(CHECKPOINTS)/*/config.json)))
OUTPUTS := $(NAMES:%=$(OUT)/outputs/%.jsonl)
ANNOTATIONS := $(NAMES:%=$(OUT)/annotations/%.jsonl)

.PHONY: night annotations
.DELETE_ON_ERROR:

# the outputs are named here so that make keeps them (a file only a pattern rule names would be
# deleted as intermediate)
night: $(OUTPUTS) $(ANNOTATIONS) $(if $(CANARIES),$(FROZEN))
ifeq ($(NAMES),)
	@echo "nightly: no checkpoint folder with a config.json in $(CHECKPOINTS); nothing to evaluate" >&2
else
	@# with BATCH, a checkpoint whose questions are pending has no annotations file yet; the canaries'
	@# verdict (exit 4: a drift) ends the night after the board and the plot are written
	@done="$$(ls $(ANNOTATIONS) 2>/dev/null)"; drift=0; \
	if [ -z "$$done" ]; then echo "nightly: every checkpoint's questions are pending in batches" >&2; else \
	farm-winrate $$done --bootstrap $(BOOTSTRAP) --seed $(SEED) --history $(HISTORY) \
		-o $(OUT)/leaderboard.jsonl || exit $$?; fi; \
	$(if $(CANARIES),$(CANARY_CHECK) || drift=$$?;) \
	if [ -s $(HISTORY) ]; then farm-plot history $(HISTORY) -o $(OUT)/history.png || exit $$?; fi; \
	exit $$drift
endif

# tonight's canaries, asked past the cache, against the frozen verdicts
CANARY_CHECK = farm-annotate $(CANARIES) --pool $(POOL) --no-cache --seed $(SEED) --ledger $(LEDGER) \
	$(ANNOTATE_OPTS) -q -o $(OUT)/canaries/tonight.jsonl && farm-winrate $(OUT)/canaries/tonight.jsonl \
	--canaries $(FROZEN) --drift-level $(DRIFT_LEVEL) --history $(HISTORY) -o $(OUT)/canaries/tonight_check.jsonl

# the canaries' first verdicts, each asked twice (the judge's self-agreement is the baseline)
$(FROZEN): $(CANARIES)
	@mkdir -p $(@D)
	farm-annotate $< --pool $(POOL) --no-cache --seed $(SEED) --ledger $(LEDGER) $(ANNOTATE_OPTS) -q -o $(@D)/freeze-1.jsonl
	farm-annotate $< --pool $(POOL) --no-cache --seed $$(( $(SEED) + 1 )) --ledger $(LEDGER) $(ANNOTATE_OPTS) -q -o $(@D)/freeze-2.jsonl
	cat $(@D)/freeze-1.jsonl $(@D)/freeze-2.jsonl > $@.tmp && mv $@.tmp $@

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
