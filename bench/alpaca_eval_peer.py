"""The peer in bench_annotate.py: AlpacaEval's pairwise annotator at its default settings (the
`alpaca_eval_gpt4` configuration: one pair per request, OPENAI_MAX_CONCURRENCY=5) on the same local
server. Runs in its own virtual environment (bench/out/alpaca-eval-venv, `pip install alpaca-eval`),
never in farmkit's. Usage: python alpaca_eval_peer.py PAIRS.jsonl -> one JSON line (seconds, pairs, parsed)."""

import json
import sys
import time

from alpaca_eval.annotators import PairwiseAnnotator


def main() -> None:
    pairs = [json.loads(line) for line in open(sys.argv[1])]
    annotator = PairwiseAnnotator(annotators_config="alpaca_eval_gpt4", caching_path=None)
    first = [{"instruction": p["instruction"], "output": p["output_1"]} for p in pairs]
    second = [{"instruction": p["instruction"], "output": p["output_2"]} for p in pairs]
    started = time.perf_counter()
    annotations = annotator.annotate_head2head(first, second)
    seconds = time.perf_counter() - started
    parsed = sum(a.get("preference") in (1, 2, 1.0, 2.0) for a in annotations)
    print(json.dumps({"seconds": seconds, "pairs": len(pairs), "parsed": parsed}))


if __name__ == "__main__":
    main()
