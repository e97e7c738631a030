# Included by examples/Makefile (it uses the Makefile's OUT, SEED, PYTHON and SIM_EVALS).
# -------------------------------------------------------------------------------------------
# Your own annotators on the demo's evaluation (docs/humans.md):
#
#   make humans                serves HUMAN_PER_SYSTEM of each system's evaluation pairs the simulated
#                              pool judged (against the reference) with farm-label and prints each
#                              annotator's link; Ctrl-C stops it and the same command resumes. Once
#                              every pair is labelled, the same command prints the report instead.
#   make humans-report         the agreement table (farm-correlate --judge --humans) and the
#                              prediction-powered board (farm-winrate --humans) on the labels so far
#   make humans HUMAN_ANNOTATORS=alice,bob,carol HUMAN_OVERLAP=0.25 HUMAN_HOST=0.0.0.0 HUMAN_PORT=8000
#
# The pairs are a seeded uniform sample of each system's judged ones (human_sample.py), as
# prediction-powered inference assumes: 40 a system by default, where farm-winrate's interval is
# checked to hold (below it the board flags small_sample and says so). At SIZE=demo each system has
# only N_VAL = 20 judged pairs: all 20 of each are labelled (160 for the 8 systems) and flagged;
# from SIZE=small (200 prompts) each system gets its 40 (320 labels). HUMAN_N=N draws N in all instead. LABELS is complete when every annotator has labelled their whole queue, as
# `farm-label ... --status` says.

HUMAN_PER_SYSTEM ?= 40
HUMAN_N ?=
HUMAN_ANNOTATORS ?= 3
HUMAN_OVERLAP ?= 0.25
HUMAN_HOST ?= 127.0.0.1
HUMAN_PORT ?= 0
HUMAN_FORMAT ?= table
HUMANS_OUT ?= $(OUT)/humans
HUMAN_SIM := $(HUMANS_OUT)/sim_prefs.jsonl
HUMAN_PAIRS := $(HUMANS_OUT)/pairs.jsonl
HUMAN_LABELS := $(HUMANS_OUT)/labels.jsonl

# the report's two commands (a variable, not a sub-make: `make -n humans` must run nothing)
HUMAN_REPORT = farm-correlate --judge $(HUMAN_SIM) --humans $(HUMAN_LABELS) --format $(HUMAN_FORMAT) && \
	farm-winrate $(HUMAN_SIM) --humans $(HUMAN_LABELS) --format $(HUMAN_FORMAT)

# the simulated pool's verdicts on every evaluation pair, in one file: what the humans are compared with
$(HUMAN_SIM): $(SIM_EVALS)
	@mkdir -p $(@D)
	cat $^ > $@

$(HUMAN_PAIRS): $(HUMAN_SIM)
	$(PYTHON) human_sample.py $< $(if $(HUMAN_N),-n $(HUMAN_N),--per-system $(HUMAN_PER_SYSTEM)) --seed $(SEED) -o $@

# farm-label's own command, and its --status (exit 0 once LABELS is complete, 75 before; 1 while a
# server holds LABELS): the recipe asks farm-label rather than counting lines itself
HUMAN_LABEL = farm-label $(HUMAN_PAIRS) -o $(HUMAN_LABELS) --annotators $(HUMAN_ANNOTATORS) \
	--overlap $(HUMAN_OVERLAP) --seed $(SEED)

# --status: 0 complete (the report), 75 not yet (serve it); anything else (1: a server still holds
# LABELS, or a bad file) is said by farm-label itself and stops the recipe, never a second server
humans: $(HUMAN_PAIRS) $(HUMAN_SIM)
	@$(HUMAN_LABEL) --status -q > /dev/null; status=$$?; \
	if [ $$status -eq 0 ]; then \
	  $(HUMAN_REPORT); \
	elif [ $$status -eq 75 ]; then \
	  echo "humans: $(HUMAN_LABELS) is not complete; serving it (Ctrl-C stops, the same command resumes)"; \
	  $(HUMAN_LABEL) --host $(HUMAN_HOST) --port $(HUMAN_PORT); \
	else \
	  exit $$status; \
	fi

humans-report: $(HUMAN_SIM)
	@test -s $(HUMAN_LABELS) || { echo "humans-report: no labels in $(HUMAN_LABELS) yet: run make humans"; exit 1; }
	$(HUMAN_REPORT)

.PHONY: humans humans-report
