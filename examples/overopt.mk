# Included by examples/Makefile (it uses the Makefile's variables: OUT, MODEL, CACHE, ...).
# -------------------------------------------------------------------------------------------
# Reward over-optimization (AlpacaFarm's figure 4): two reward models trained on the same pairs,
# one labelled by the noisy pool ($(POOL), `pool`) and one by a single deterministic judge
# ($(SINGLE_POOL), `single`); best-of-n for n in $(OVEROPT_NS), reranking one sampling pass, and
# PPO checkpoints against each; every system's gold win rate against its mean surrogate reward.
#
# The study has its own split of $(DATA) and its own SFT model, so that its reward models see far
# more pairs than the demo's ($(OO_N_PREF) instead of $(N_PREF)); nothing in it is shared with the
# demo but the reference outputs' model and the annotation cache.
# (its sizes, OO_N_* and OVEROPT_*, are rows of sizes.mk)

OO_RM_STEPS ?= -1
OO_RM_LR ?= 2e-5
OO_TEMPERATURE ?= 1.0

OO := $(OUT)/overopt
OO_SPLITS := $(OO)/splits
OO_SFT := $(OO)/models/sft
OO_REFERENCE := $(OO)/reference.jsonl
OVEROPT_RMS ?= pool single
OVEROPT_OUTPUTS := $(OVEROPT_RMS:%=$(OO)/bon_%.jsonl) $(OVEROPT_RMS:%=$(OO)/ppo_%.jsonl)
OO_SPLIT_FILES := $(OO_SPLITS)/sft.jsonl $(OO_SPLITS)/pref.jsonl $(OO_SPLITS)/unlabeled.jsonl $(OO_SPLITS)/val.jsonl

overopt:
	$(MAKE) --no-print-directory -j$(JOBS) overopt-results
	@cat $(OO)/overopt.jsonl

# (the model folders are named so that make keeps them: pattern-built files it would delete as intermediates)
overopt-results: $(OVEROPT_RMS:%=$(OO)/rm_%/meta.json) $(OVEROPT_RMS:%=$(OO)/ppo_%/meta.json) $(OVEROPT_OUTPUTS) $(OO)/overopt.jsonl

$(OO_SPLIT_FILES): $(OO_SPLITS)/.done ;
$(OO_SPLITS)/.done: $(DATA)
	farm-split $< -o $(OO_SPLITS) --sizes sft=$(N_SFT),pref=$(OO_N_PREF),unlabeled=$(OO_N_UNLABELED),val=$(OO_N_VAL) --seed $(SEED) -q
	touch $@ && touch $(OO_SPLIT_FILES)

$(OO_SFT)/meta.json $(OO)/pairs.jsonl $(OO)/rm_pool/meta.json $(OO)/rm_single/meta.json: export OMP_NUM_THREADS = $(HEAD_THREADS)

$(OO_SFT)/meta.json: $(OO_SPLITS)/sft.jsonl
	$(call train,farm-sft) $(MODEL) $< -o $(@D) --max-steps $(SFT_STEPS) --batch-size $(TRAIN_BATCH) $(TRAIN_OPTS)

$(OO)/pairs.jsonl: $(OO_SFT)/meta.json $(OO_SPLITS)/pref.jsonl
	farm-sample $(OO_SFT) $(OO_SPLITS)/pref.jsonl -n 2 --temperature 1.0 $(SAMPLE_OPTS) -o $@

# The same pairs, labelled twice.
$(OO)/prefs_pool.jsonl: $(OO)/pairs.jsonl
	farm-annotate --pool $(POOL) $< --cache $(CACHE) --seed $(SEED) -q -o $@

$(OO)/prefs_single.jsonl: $(OO)/pairs.jsonl
	farm-annotate --pool $(SINGLE_POOL) $< --cache $(CACHE) --seed $(SEED) -q -o $@

$(OO)/rm_%/meta.json: $(OO_SFT)/meta.json $(OO)/prefs_%.jsonl
	$(call train,farm-rm-train) $(OO_SFT) $(OO)/prefs_$*.jsonl -o $(@D) --max-steps $(OO_RM_STEPS) --learning-rate $(OO_RM_LR) \
		--batch-size $(TRAIN_BATCH) $(TRAIN_OPTS)

# One sampling pass of max(n) answers per val prompt (the last of OVEROPT_NS), scored by each reward model and reranked.
$(OO)/samples.jsonl: $(OO_SFT)/meta.json $(OO_SPLITS)/val.jsonl
	farm-sample $(OO_SFT) $(OO_SPLITS)/val.jsonl -n $(lastword $(subst $(comma), ,$(OVEROPT_NS))) --temperature $(OO_TEMPERATURE) \
		--generator sft $(SAMPLE_OPTS) -o $@

$(OO)/bon_%.jsonl: $(OO)/samples.jsonl $(OO)/rm_%/meta.json
	farm-score $(OO)/rm_$* $< -q -o $(OO)/scored_$*.jsonl
	$(PYTHON) overopt.py rerank $(OO)/scored_$*.jsonl -n $(OVEROPT_NS) --generator $* > $@.tmp && mv $@.tmp $@

# PPO against each reward model, with a checkpoint every $(OVEROPT_PPO_EVERY) steps; every
# checkpoint answers the val prompts and its answers are scored by the reward model it optimized.
$(OO)/ppo_%/meta.json: $(OO_SFT)/meta.json $(OO)/rm_%/meta.json $(OO_SPLITS)/unlabeled.jsonl
	$(call train,farm-ppo) $(OO_SFT) $(OO)/rm_$* $(OO_SPLITS)/unlabeled.jsonl -o $(@D) --steps $(OVEROPT_PPO_STEPS) \
		--save-steps $(OVEROPT_PPO_EVERY) $(PPO_OPTS) $(TRAIN_OPTS)

$(OO)/ppo_%.jsonl: $(OO)/ppo_%/meta.json $(OO_SPLITS)/val.jsonl
	rm -f $@.tmp && for policy in $(OO)/ppo_$*-checkpoints/step-* $(OO)/ppo_$*; do \
		step=$$($(PYTHON) -c "import json,sys; print(json.load(open(sys.argv[1])).get('step', $(OVEROPT_PPO_STEPS)))" $$policy/meta.json); \
		farm-sample $$policy $(OO_SPLITS)/val.jsonl -n 1 --generator ppo-$*-step-$$step --temperature 0.7 $(SAMPLE_OPTS) \
			| farm-score $(OO)/rm_$* - -q >> $@.tmp || exit 1; \
	done && mv $@.tmp $@

# Every system against the base model's answers, by the gold annotator; one leaderboard; the plot.
$(OO_REFERENCE): $(OO_SPLITS)/val.jsonl
	farm-sample $(MODEL) $< -n 1 --generator base --temperature 0.7 $(SAMPLE_OPTS) -o $@

$(OO)/gold.jsonl: $(OVEROPT_OUTPUTS) $(OO_REFERENCE)
	cat $(OVEROPT_OUTPUTS) | farm-annotate --pool $(GOLD) --reference $(OO_REFERENCE) - --cache $(CACHE) --seed $(SEED) -q -o $@

$(OO)/leaderboard_gold.jsonl: $(OO)/gold.jsonl
	farm-winrate $< --seed $(SEED) -q -o $@

$(OO)/overopt.jsonl: $(OO)/leaderboard_gold.jsonl $(OVEROPT_OUTPUTS) overopt.py
	$(PYTHON) overopt.py plot $< $(OVEROPT_OUTPUTS) --scored $(OVEROPT_RMS:%=$(OO)/scored_%.jsonl) \
		--label pool="$(POOL) preferences" --label single="$(SINGLE_POOL) preferences" -o $(OO)/overopt.png > $@.tmp && mv $@.tmp $@

