# Included by examples/Makefile (it uses the Makefile's variables: OUT, SFT, RM, PREFS, SPLITS, ...).
# -------------------------------------------------------------------------------------------
# Methods at an equal label budget, in the offline simulation:
#
#   make methods-at-equal-budget SIZE=ci|demo|full
#
# PPO, RLOO, GRPO, GRPO from the pool, DPO, online DPO and best-of-n start from the demo's SFT model.
# Every one of them gets the same N_PREF labels from the pool $(POOL): PPO, RLOO, GRPO and best-of-n
# through the demo's reward model (trained on the demo's N_PREF labelled pairs), DPO from those very
# pairs, online DPO by having $(POOL) label N_PREF fresh pairs of its own policy's answers over
# EB_ODPO_ROUNDS rounds, and grpo-pool by having $(POOL) judge pairs within its groups (--pool, no
# reward model): each response against EB_POOL_K others, so a step asks ROLLOUT_BATCH x EB_POOL_K / 2
# pairs and EB_POOL_STEPS = 2 N_PREF / (ROLLOUT_BATCH x EB_POOL_K) steps ask N_PREF. Each method's checkpoints (every EB_EVERY steps, each round, DPO's end, each n) are judged
# by the gold annotator $(GOLD) on the val prompts (held out from every method's training) against
# the SFT model's answers: --gold. The table puts side by side, per method, its last gold win rate,
# the surrogate reward of its answers to the val prompts (farm-sample | farm-score with the reward
# model), its KL to SFT on the gold answers, their length, and its budget (labels used, tokens
# sampled, wall time, from meta.json); the plot draws every gold-judged checkpoint's gold win rate
# against its KL. (its sizes, EB_*, are rows of sizes.mk)

EB := $(OUT)/equal-budget
EB_METHODS := ppo rloo grpo grpo-pool dpo odpo
EB_POLICIES := $(EB_METHODS:%=$(EB)/%/meta.json)
EB_ANSWERS := $(EB_METHODS:%=$(EB)/answers/%.jsonl)
GOLD_OPTS = --gold $(GOLD) --gold-prompts $(SPLITS)/val.jsonl --gold-size $(N_VAL)
EB_GROUP_OPTS = --steps $(EB_STEPS) --save-steps $(EB_EVERY) --num-samples $(EB_K) $(PPO_OPTS)
EB_ODPO_PROMPTS = $(shell expr $(N_PREF) / $(EB_ODPO_ROUNDS))
EB_POOL_STEPS = $(shell expr 2 \* $(N_PREF) / \( $(ROLLOUT_BATCH) \* $(EB_POOL_K) \))
# about as many gold-judged checkpoints as the other group methods have (EB_STEPS / EB_EVERY)
EB_POOL_EVERY = $(shell expr \( $(EB_POOL_STEPS) \* $(EB_EVERY) + $(EB_STEPS) - 1 \) / $(EB_STEPS))
EB_ODPO_STEPS = $(shell s=$$(expr $(METHOD_STEPS) / $(EB_ODPO_ROUNDS)); [ "$$s" -ge 1 ] 2>/dev/null && echo $$s || echo 1)

.PHONY: methods-at-equal-budget equal-budget-results

methods-at-equal-budget:
	$(MAKE) --no-print-directory -j$(JOBS) equal-budget-results
	@cat $(EB)/table.txt

equal-budget-results: $(EB_POLICIES) $(EB)/bon/best.jsonl $(EB)/table.txt $(EB)/budget.png

$(EB)/ppo/meta.json: $(SFT)/meta.json $(RM)/meta.json $(SPLITS)/unlabeled.jsonl $(SPLITS)/val.jsonl
	$(call train,farm-ppo) $(SFT) $(RM) $(SPLITS)/unlabeled.jsonl -o $(@D) --steps $(EB_STEPS) --save-steps $(EB_EVERY) \
		$(PPO_OPTS) $(GOLD_OPTS) $(TRAIN_OPTS)

$(EB)/rloo/meta.json: $(SFT)/meta.json $(RM)/meta.json $(SPLITS)/unlabeled.jsonl $(SPLITS)/val.jsonl
	$(call train,farm-rloo) $(SFT) $(RM) $(SPLITS)/unlabeled.jsonl -o $(@D) $(EB_GROUP_OPTS) $(GOLD_OPTS) $(TRAIN_OPTS)

$(EB)/grpo/meta.json: $(SFT)/meta.json $(RM)/meta.json $(SPLITS)/unlabeled.jsonl $(SPLITS)/val.jsonl
	$(call train,farm-grpo) $(SFT) $(RM) $(SPLITS)/unlabeled.jsonl -o $(@D) $(EB_GROUP_OPTS) $(GOLD_OPTS) $(TRAIN_OPTS)

$(EB)/grpo-pool/meta.json: $(SFT)/meta.json $(SPLITS)/unlabeled.jsonl $(SPLITS)/val.jsonl
	$(call train,farm-grpo) $(SFT) $(SPLITS)/unlabeled.jsonl -o $(@D) --pool $(POOL) --cache $(CACHE) --opponents $(EB_POOL_K) \
		--steps $(EB_POOL_STEPS) --save-steps $(EB_POOL_EVERY) --num-samples $(EB_K) $(PPO_OPTS) $(GOLD_OPTS) $(TRAIN_OPTS)

$(EB)/dpo/meta.json: $(SFT)/meta.json $(PREFS) $(SPLITS)/val.jsonl
	$(call train,farm-dpo) $(SFT) $(PREFS) -o $(@D) --max-steps $(METHOD_STEPS) --batch-size $(TRAIN_BATCH) \
		--max-new-tokens $(MAX_NEW_TOKENS) $(GOLD_OPTS) $(TRAIN_OPTS)

$(EB)/odpo/meta.json: $(SFT)/meta.json $(SPLITS)/unlabeled.jsonl $(SPLITS)/val.jsonl
	$(call train,farm-online-dpo) $(SFT) $(SPLITS)/unlabeled.jsonl -o $(@D) --pool $(POOL) --cache $(CACHE) \
		--rounds $(EB_ODPO_ROUNDS) --prompts-per-round $(EB_ODPO_PROMPTS) --max-steps $(EB_ODPO_STEPS) --batch-size $(TRAIN_BATCH) \
		--max-new-tokens $(MAX_NEW_TOKENS) --generation-batch-size $(GEN_BATCH) $(GOLD_OPTS) $(TRAIN_OPTS)

# best-of-n on the val prompts themselves, every n of the sweep from one sampling pass; its metrics
# rows (one per n) in bon/metrics.jsonl, where farm-plot curves finds them
$(EB)/bon/best.jsonl: $(SFT)/meta.json $(RM)/meta.json $(SPLITS)/val.jsonl
	@mkdir -p $(@D)
	farm-bon $(SFT) $(RM) $(SPLITS)/val.jsonl -n $(EB_BON_NS) --generator sft --metrics $(@D)/metrics.jsonl \
		$(BON_OPTS) $(GOLD_OPTS) -o $@

# every trained policy answers the val prompts, scored by the reward model (the surrogate)
$(EB)/answers/%.jsonl: $(EB)/%/meta.json $(SPLITS)/val.jsonl $(RM)/meta.json
	@mkdir -p $(@D)
	farm-sample $(EB)/$* $(SPLITS)/val.jsonl -n 1 --generator $* --temperature 1.0 $(SAMPLE_OPTS) | farm-score $(RM) - -q > $@.tmp && mv $@.tmp $@

$(EB)/table.txt: $(EB_POLICIES) $(EB_ANSWERS) $(EB)/bon/best.jsonl budget.py
	$(PYTHON) budget.py $(foreach m,$(EB_METHODS),--run $(m)=$(EB)/$(m) --answers $(m)=$(EB)/answers/$(m).jsonl) \
		--run bon=$(EB)/bon --answers bon=$(EB)/bon/best.jsonl -o $(EB)/budget.jsonl > $@.tmp && mv $@.tmp $@

$(EB)/budget.png: $(EB_POLICIES) $(EB)/bon/best.jsonl
	farm-plot curves $(EB_METHODS:%=$(EB)/%) $(EB)/bon --x gold_kl --field gold_win_rate --field gold_answer_length -q -o $@
