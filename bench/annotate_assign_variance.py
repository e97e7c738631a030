"""What farm-annotate's --assign-by does to the variance, over seeds, of the difference between two models'
win rates against one reference (oracle pool sim_eval_offline, synthetic outputs, no API).

    python bench/annotate_assign_variance.py [INSTRUCTIONS] [SEEDS]
"""

import random
import statistics
import sys

from farmkit.annotate.engine import Annotator
from farmkit.annotate.pairs import Item
from farmkit.annotate.pools import load_pool

rng = random.Random(0)
words = "the model answers clearly because data shows results improve when training uses more examples".split()


def text(n: int) -> str:
    return " ".join(rng.choice(words) for _ in range(n)) + "."


n_instr = int(sys.argv[1]) if len(sys.argv) > 1 else 300
instr = [f"Explain topic {i} in detail." for i in range(n_instr)]
ref = [text(rng.randint(10, 60)) for _ in instr]
a = [text(rng.randint(10, 60)) for _ in instr]
b = [text(rng.randint(10, 60)) for _ in instr]
pool = load_pool("sim_eval_offline")


def wr(outputs, seed, mode):
    items = [
        Item({"instruction": q, "input": "", "output_1": r, "output_2": o})
        for q, r, o in zip(instr, ref, outputs, strict=True)
    ]
    with Annotator(pool, seed=seed, assign_by=mode) as annotator:
        recs = list(annotator.run(items))
    return statistics.mean(r["preference"] - 1 for r in recs)


for mode in ("item", "instruction"):
    diffs = [
        wr(a, s, mode) - wr(b, s, mode)
        for s in range(int(sys.argv[2]) if len(sys.argv) > 2 else 100)
    ]
    print(
        f"{mode}: mean difference {statistics.mean(diffs):.4f}, variance {statistics.variance(diffs):.3e}, "
        f"sd {statistics.stdev(diffs):.4f}"
    )
