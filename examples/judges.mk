# Included by examples/Makefile (it uses the Makefile's PYTHON and SEED, and validate.mk's SHARED_DATA).
# -------------------------------------------------------------------------------------------
# The offline judges, learned from real verdicts by farm-judge-train (systems held out 5 ways):
#
#   make judges                  every judge below into $(JUDGES_OUT)/NAME (AlpacaEval's data and
#                                PandaLM's test set under $(SHARED_DATA))
#   make judges ship-judges      and copy them into farmkit/annotate/judges/, where pools name them
#
#   gpt4            GPT-4's AlpacaEval verdicts (alpaca_eval_gpt4, 41k pairs, 51 systems): the gold
#   gpt4_turbo      AlpacaEval 2's weighted GPT-4 Turbo verdicts (14k pairs, 18 systems)
#   gpt4_turbo_cot  GPT-4 Turbo with chain of thought (5.6k pairs, 7 systems)
#   humans          PandaLM's three human labels per pair (999 pairs; their mean as a soft label)
# AlpacaEval's data is CC BY-NC 4.0, PandaLM's Apache-2.0: each judge's meta.json says which.

ALPACA_EVAL ?= $(SHARED_DATA)/alpaca_eval
JUDGES_OUT ?= runs/judges
JUDGE_FOLDS ?= 5
PANDALM ?= $(SHARED_DATA)/human_prefs/pandalm_testset_v1.json
judge_annotations.gpt4 := alpaca_eval_gpt4
judge_board.gpt4 := data_AlpacaEval/alpaca_eval_gpt4_leaderboard.csv
judge_annotations.gpt4_turbo := weighted_alpaca_eval_gpt4_turbo
judge_board.gpt4_turbo := data_AlpacaEval_2/weighted_alpaca_eval_gpt4_turbo_leaderboard.csv
judge_annotations.gpt4_turbo_cot := alpaca_eval_cot_gpt4_turbo_fn
judge_board.gpt4_turbo_cot := data_AlpacaEval_2/alpaca_eval_cot_gpt4_turbo_fn_leaderboard.csv
ALPACA_JUDGES := gpt4 gpt4_turbo gpt4_turbo_cot

judges: $(foreach j,$(ALPACA_JUDGES) humans,$(JUDGES_OUT)/$(j)/meta.json)

$(JUDGES_OUT)/%/meta.json:
	farm-judge-train $(ALPACA_EVAL)/annotations/$(judge_annotations.$*).jsonl.gz --alpaca-eval $(ALPACA_EVAL) \
	  --leaderboard $(ALPACA_EVAL)/leaderboards/$(judge_board.$*) --human $(PANDALM) \
	  --folds $(JUDGE_FOLDS) --seed $(SEED) -o $(JUDGES_OUT)/$*

$(JUDGES_OUT)/humans/meta.json:
	mkdir -p $(JUDGES_OUT)
	$(PYTHON) pandalm_prefs.py $(PANDALM) $(JUDGES_OUT)/pandalm_prefs.jsonl
	farm-judge-train $(JUDGES_OUT)/pandalm_prefs.jsonl --folds 4 --seed $(SEED) \
	  --license Apache-2.0 --source "WeOpenML/PandaLM test set v1, three human labels per pair" \
	  -o $(JUDGES_OUT)/humans

ship-judges:
	for j in $(ALPACA_JUDGES) humans; do \
	  mkdir -p ../farmkit/annotate/judges/$$j && cp $(JUDGES_OUT)/$$j/meta.json $(JUDGES_OUT)/$$j/weights.npz ../farmkit/annotate/judges/$$j/; \
	done

.PHONY: judges ship-judges
