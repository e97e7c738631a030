"""Glue for the reward over-optimization study (`make overopt`); the work is farmkit's
(farmkit/evaluate/overopt.py, `farm-plot overopt`; the rerank is farmkit/methods/bon.py's).

    python overopt.py rerank SCORED -n 1,2,4,...,64 --generator NAME
        scored samples (farm-score output, several per prompt in sampling order) -> for each n, the
        best of the first n samples of every prompt, as output records named NAME-best-of-N
    python overopt.py plot GOLD_LEADERBOARD OUTPUTS... -o overopt.png [--scored FILE...] [--label RM=TEXT...]
        `farm-plot overopt` over the study's files, each PPO run found beside its outputs
        (ppo_RM.jsonl -> the run ppo_RM, whose metrics give each checkpoint's KL)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from farmkit.tools import farm_plot

from farmkit.core.io import write_records
from farmkit.methods.bon import rerank


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rerank_parser = commands.add_parser("rerank")
    rerank_parser.add_argument("scored")
    rerank_parser.add_argument("-n", required=True, help="comma-separated sample counts")
    rerank_parser.add_argument("--generator", required=True)
    plot_parser = commands.add_parser("plot")
    plot_parser.add_argument("leaderboard")
    plot_parser.add_argument("outputs", nargs="+")
    plot_parser.add_argument("-o", "--output", required=True, help="the PNG")
    plot_parser.add_argument(
        "--scored",
        nargs="+",
        default=[],
        metavar="FILE",
        help="each reward model's scores of the whole sampling pass (agreement with gold)",
    )
    plot_parser.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="RM=TEXT",
        help="panel title of a reward model",
    )
    args = parser.parse_args(argv)
    if args.command == "rerank":
        write_records(
            rerank(args.scored, sorted({int(n) for n in args.n.split(",")}), args.generator)
        )
        return
    runs = []
    for output in map(Path, args.outputs):
        match = re.fullmatch(r"ppo_(.+)\.jsonl", output.name)
        if match and (output.parent / f"ppo_{match[1]}").is_dir():
            runs += ["--ppo-run", f"{match[1]}={output.parent / f'ppo_{match[1]}'}"]
    farm_plot.main(
        [
            "overopt",
            args.leaderboard,
            *args.outputs,
            "-o",
            args.output,
            *runs,
            *(option for path in args.scored for option in ("--scored", path)),
            *(option for label in args.label for option in ("--label", label)),
        ]
    )


if __name__ == "__main__":
    main(sys.argv[1:])
