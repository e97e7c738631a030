# Size presets of examples/Makefile, one table: a row per variable, a column per SIZE. The CPU
# presets (ci, demo) run the paper's steps at toy scale; `full` is AlpacaFarm's (Dubois et al., 2023,
# appendix: SFT 3 epochs, reward model and DPO 1 epoch, PPO 390 steps with rollout batch 512,
# best-of-16). A variable set on the command line or in the environment wins over its row.
# -1 steps means "by epochs"; $$(X) is "whatever X is".
#
#                         ci        demo                  study     full
N_INSTRUCTIONS.sizes    := 900       900                   4800      900       # the default DATA's instructions (make_instructions.py -n; 900 shipped)
N_SFT.sizes             := 24        300                   300       10000     # demonstrations for SFT
N_PREF.sizes            := 8         40                    2600      10000     # instructions with 2 samples each, annotated
N_UNLABELED.sizes       := 8         24                    64        20000     # prompts for PPO, Quark and expert iteration
N_VAL.sizes             := 6         20                    200       2000      # evaluation prompts
MAX_NEW_TOKENS.sizes    := 16        32                    32        300
TRAIN_BATCH.sizes       := 8         8                     8         16
GEN_BATCH.sizes         := 16        32                    32        64
SFT_STEPS.sizes         := 4         16                    48        -1        # full: 3 epochs
RM_STEPS.sizes          := 4         10                    -1        -1        # -1: RM_EPOCHS epochs
RM_LR.sizes             := 1e-5      1e-5                  5e-5      1e-5      # farm-rm-train --learning-rate (study: see below)
RM_EPOCHS.sizes         := 1         1                     1         1         # farm-rm-train --epochs, where RM_STEPS is -1 (study: see below)
METHOD_STEPS.sizes      := 2         6                     12        -1        # DPO, FeedME, reward conditioning, expert iteration
DPO_LR.sizes            := 1e-6      1e-5                  1e-5      1e-6      # farm-dpo --learning-rate (see below)
BON_N.sizes             := 2         4                     8         16
PPO_STEPS.sizes         := 2         6                     32        390       # full: AlpacaFarm's 10 epochs of 20,000 prompts, 512 a step
PPO_LR.sizes            := 1e-5      5e-5                  5e-5      -         # farm-ppo --learning-rate (see below; full: the preset's)
ROLLOUT_BATCH.sizes     := 4         8                     8         512       # PPO rollouts per step, Quark prompts per round
QUARK_ROUNDS.sizes      := 1         6                     8         390       # full: AlpacaFarm's 10 epochs, 512 prompts a round
PRESET.sizes            := none      none                  none      alpacafarm # farm-ppo and farm-quark --preset (none: the rows; see the Makefile)
QUARK_LR.sizes          := 1e-5      5e-5                  5e-5      -         # farm-quark --learning-rate (see below; full: the preset's)
QUARK_CONTROL.sizes     := none      none                  none      -         # farm-quark --control-token (see the Makefile; full: the preset's)
BOOTSTRAP.sizes         := 100       1000                  1000      1000      # farm-winrate's bootstrap resamples
BACKEND.sizes           := hf        hf                    hf        vllm      # farm-sample's backend
OVEROPT_NS.sizes        := 1,2,4     1,2,4,8,16,32,64      1,2,4,8,16,32,64 1,2,4,8,16,32,64,128,256  # best-of-n sweep of `make overopt`, smallest first
OO_N_PREF.sizes         := 8         400                   400       $$(N_PREF)       # pairs both overopt reward models learn from (1 epoch)
OO_N_UNLABELED.sizes    := 8         64                    64        $$(N_UNLABELED)  # overopt PPO prompts
OO_N_VAL.sizes          := 6         40                    40        $$(N_VAL)        # overopt evaluation prompts (max(OVEROPT_NS) samples each)
OVEROPT_PPO_STEPS.sizes := 2         12                    12        400
OVEROPT_PPO_EVERY.sizes := 1         3                     3         40        # a PPO checkpoint every so many steps
EB_STEPS.sizes          := 2         6                     6         400       # methods-at-equal-budget: PPO, RLOO and GRPO steps
EB_EVERY.sizes          := 1         2                     2         40        # a gold-judged checkpoint every so many steps
EB_K.sizes              := 2         4                     4         4         # RLOO and GRPO samples per prompt (divides ROLLOUT_BATCH)
EB_POOL_K.sizes         := 1         2                     2         2         # grpo-pool --opponents (below EB_K; EB_K x it even)
EB_ODPO_ROUNDS.sizes    := 2         2                     2         4         # online DPO rounds, N_PREF labels over all of them
EB_BON_NS.sizes         := 1,2       1,2,4                 1,2,4     1,4,16    # best-of-n sweep, smallest first

# The demo column gives PPO and Quark enough updates for their mechanism to show within the
# 20-minute budget: at the tools' default 1e-5, 3 PPO steps and 2 Quark rounds left the policies where
# SFT was (PPO's KL -0.003 per token, Quark's 0.0015; training reward +0.270 -> +0.041 and
# +0.323 -> +0.306). At 5e-5, 12 steps and 6 rounds on the same SFT model and reward model, Quark's
# rollout reward rose (+0.323 -> +0.522, KL 0.26 per token) and PPO's KL grew from 0 and stayed
# between 0.10 and 0.40 per token from step 4 on, its reward flat (+0.270 -> +0.318); neither
# collapsed (README, The demo). DPO at AlpacaFarm's 1e-6 for 6 steps left the policy where it was
# (implicit reward margin 0.04 at step 6, val answers identical to SFT's, 20 of 20); at 1e-5 its
# margin on its pairs reached 0.38 by step 6. The full column runs PPO and Quark with
# --preset alpacafarm: every hyperparameter AlpacaFarm's scripts set (README, farm-ppo and
# farm-quark), its rows marked - are the preset's.
# With the learned offline judges (issue 23) a whole `make demo` took 12 min 27 s at 12 PPO steps
# (two niced test collections beside it), over the 12-minute budget, and 12 min 11 s at 9 (a short
# test run beside it). PPO, the last step to finish, now runs 6 steps, two passes over the 24
# unlabeled prompts at 8 a step: 9 min 49 s with nothing beside it; 8 min 53 s on 2026-11-27, the
# tools keeping freed memory (docs/demo.md has the run).
#
# The study column (`make study`, issue 23) is sized by the work each step does against the demo's,
# not by running it: 200 evaluation prompts (each system's val sampling 7 generation batches of 32
# against the demo's 1; best-of-8 on them 50 batches against 3), 300 labelled pairs (19 batches of
# samples against 3; the reward model 38 steps against 10; since raised to 2,600 pairs: below), SFT
# 48 steps against 16, DPO, FeedME and reward conditioning 12 against 6, expert iteration 64 prompts
# x 8 samples and 12 steps, PPO 16 steps (now 32) against 12, Quark 8 rounds of 8 prompts x 8 samples against
# 6 x 8 x 4. Weighting each ratio by the step's time in a demo run (2026-11-26, on a machine at load
# 5-7, 3,392 s of steps: PPO 808, reward model 575, DPO 409, Quark 389, SFT 299, expert iteration
# 216, val sampling 8 x ~26, FeedME 127, pairs 115, reward conditioning 77, best-of-4 67) gives
# about 2.9 times the demo's work. A started study sampled the reference on its 200 val prompts in
# 227 s at the same load (the demo's 20: 23 s), so val sampling scales nearly with the batches: with
# that, about 3.5 times, some 40 minutes against the demo's 11.5 on idle cores (an estimate).
# Annotation by the learned judges costs 1-2 s a file. Measured: `make study` from an empty
# runs/study took 37 min 8 s on 2 idle cores (2026-11-26, 38 reward-model steps; docs/demo.md, "The
# study", has what it printed and found).
# The study's labels and steps, by six runs (docs/demo.md, "The study", has them all): with 300
# and then 1,300 labelled pairs its reward model was at or near chance against gold on the
# evaluation pairs (0.525, 0.526, 0.518; 0.556 with two epochs): the pool's labels agree with gold
# on only 0.52-0.55 of the study's decided training pairs, and a quarter of the pairs are two
# identical answers. With 2,600 (N_PREF) one epoch at 5e-5 gave 0.736 and 0.760 on two draws.
# At 16 PPO steps PPO raised its reward-model score over SFT's by 0.10 (best-of-8: 0.27): hence 32,
# four passes over the 64 prompts. N_INSTRUCTIONS 4800 because farm-split's stable mode leaves a
# split short when the data are barely larger than the splits' total (3,200: 199 evaluation prompts
# and 293 demonstrations; 2,000: 53 unlabeled prompts); 4,800 fills all four for 40 of 40 seeds.
# Measured: `make study` from an empty OUT, nothing else running, took 53 min 50 s (2026-11-27);
# the reward model 0.760 [0.718, 0.801] against gold, and Quark, best-of-8, PPO and expert
# iteration above SFT at p<0.05.
#
# On a GPU machine the full run is
#   make demo SIZE=full MODEL=/models/llama-7b-sft-base DATA=alpaca_data.jsonl POOL=sim_ann EVAL_POOL=sim_eval GPUS=8
# with sampling on vLLM (BACKEND=vllm, the full preset's default) and an OpenAI-compatible endpoint
# for the LLM judges (OPENAI_BASE_URL, OPENAI_API_KEY); GOLD is then a stronger pool or human labels.
# Each training tool gets a launch it accepts and that fits a 7B model on 80 GB cards (README,
# "Scaling out": per-GPU memory by calculation, 8 GPUs): DeepSpeed ZeRO-2 for SFT, the reward model,
# DPO, expert iteration and Quark (under DDP Quark would hold ~154 GB per GPU, under ZeRO-2 ~54 GB);
# ZeRO-3 for PPO (under ZeRO-2 its four models hold ~80 GB per GPU before activations, under ZeRO-3
# ~56 GB). One step at a time (JOBS=1): each launch takes every GPU. LAUNCH or a tool's own
# *_LAUNCH on the command line wins.

column.ci := 1
column.demo := 2
column.study := 3
column.full := 4
ifeq ($(column.$(SIZE)),)
$(error SIZE must be ci, demo, study or full (got '$(SIZE)'))
endif
# every row's value in SIZE's column, unless the variable is set already (command line, environment)
$(foreach row,$(patsubst %.sizes,%,$(filter %.sizes,$(.VARIABLES))),$(eval $(row) ?= $(word $(column.$(SIZE)),$($(row).sizes))))

ifeq ($(SIZE),full)
GPUS ?= 8
CONFIGS ?= $(abspath $(dir $(lastword $(MAKEFILE_LIST)))../farmkit/configs)
LAUNCH ?= accelerate launch --config_file $(CONFIGS)/accelerate_zero2.yaml --num_processes $(GPUS)
PPO_LAUNCH ?= accelerate launch --config_file $(CONFIGS)/accelerate_zero3.yaml --num_processes $(GPUS)
JOBS ?= 1
endif
