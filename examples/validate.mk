# Included by examples/Makefile (it uses the Makefile's PYTHON and POOL).
# -------------------------------------------------------------------------------------------
# Judges measured against humans, like AlpacaEval's evaluators' leaderboard:
#
#   make validate-judges HUMANS=human_labels.jsonl POOL=sim_eval VALIDATE_N=300
#   make validate-judges POOL='gold sim_eval_offline sim_ann_offline'    (one row per pool)
#
# human_pairs.py takes the labelled pairs out of $(HUMANS) (PandaLM's test set, or preference
# records with a human `preference`) and a seeded sample of $(VALIDATE_N) of them (0: all), each
# also with its outputs swapped unless VALIDATE_BOTH_ORDERS=0;
# farm-annotate --pool $(POOL) judges the pairs without their labels; farm-correlate prints one
# row per judge (agreement under AlpacaFarm's and AlpacaEval's definitions, flip rate, bias,
# variance, length/list/first-position preferences) and the humans' own row, as markdown.
# Default HUMANS: PandaLM's 3-human test set under the shared data ($(FARMKIT_SHARED_DATA), else
# ../shared/data from the project root); the recipe says so and does nothing when it is absent.

SHARED_DATA ?= $(or $(FARMKIT_SHARED_DATA),../../shared/data)
HUMANS ?= $(SHARED_DATA)/human_prefs/pandalm_testset_v1.json
VALIDATE_N ?= 300
VALIDATE_OUT ?= runs/validate
VALIDATE_FORMAT ?= markdown
# 1: each pair is judged in both orders (twice the requests), for the flip rate; 0: as given
VALIDATE_BOTH_ORDERS ?= 1

validate-judges:
	@if [ ! -e "$(HUMANS)" ]; then \
	  echo "validate-judges: no human labels at $(HUMANS): set HUMANS=FILE or FARMKIT_SHARED_DATA; skipped"; \
	  exit 0; \
	fi; \
	set -e; mkdir -p $(VALIDATE_OUT) $(dir $(CACHE)); \
	$(PYTHON) human_pairs.py "$(HUMANS)" $(VALIDATE_OUT)/pairs.jsonl $(VALIDATE_OUT)/humans.jsonl \
	  --n $(VALIDATE_N) --seed $(SEED) $(if $(filter 1,$(VALIDATE_BOTH_ORDERS)),--both-orders); \
	for pool in $(POOL); do \
	  farm-annotate $(VALIDATE_OUT)/pairs.jsonl --pool $$pool --seed $(SEED) --cache $(CACHE) -q \
	    -o $(VALIDATE_OUT)/judge_$$(basename $$pool .yaml).jsonl; \
	done; \
	farm-correlate $(foreach p,$(POOL),--judge $(VALIDATE_OUT)/judge_$(basename $(notdir $(p))).jsonl) \
	  --humans $(VALIDATE_OUT)/humans.jsonl --key pair_id --format $(VALIDATE_FORMAT) -q

.PHONY: validate-judges
