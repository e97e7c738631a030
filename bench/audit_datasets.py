"""Audit: Hugging Face datasets as inputs (issue 21, item 4), with cases the tests do not use.

Builds dataset folders in a temporary directory (no network: the hub is offline), runs the farm-*
commands of a given bin folder on them, and prints one line per case (PASS/FAIL and why) and the
count. Run it against the main checkout's commands and this one's:

    python bench/audit_datasets.py --bin /work/main/.venv/bin
    python bench/audit_datasets.py --bin .venv/bin
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

import orjson

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


def build(root: Path) -> dict[str, str]:
    import datasets

    outputs = [
        {
            "instruction": f"Name a planet, take {i}",
            "output": f"Mars is one, take {i}.",
            "generator": "m",
        }
        for i in range(4)
    ]
    reference = [{**r, "output": "planet", "generator": "ref"} for r in outputs]
    datasets.DatasetDict(
        validation=datasets.Dataset.from_list(outputs),
        train=datasets.Dataset.from_list(outputs[:1]),
    ).save_to_disk(str(root / "outs_dict"))
    datasets.Dataset.from_list(reference).save_to_disk(str(root / "ref_single"))
    parquet = root / "parquet_repo" / "data"
    parquet.mkdir(parents=True)
    datasets.Dataset.from_list(outputs).to_parquet(
        str(parquet / "validation-00000-of-00001.parquet")
    )
    datasets.Dataset.from_list(outputs[:2]).to_parquet(
        str(parquet / "train-00000-of-00001.parquet")
    )
    prefs = [
        {"prompt": "Which is larger, 2 or 3?", "chosen": "3", "rejected": "2"},
        {"prompt": "Spell cat.", "chosen": 7, "rejected": "k a t"},  # a bad row: not text
    ]
    jsonl(root / "prefs_repo" / "data" / "train.jsonl", prefs)
    prompts = [
        {
            "messages": [
                {"role": "user", "content": "Say hi."},
                {"role": "assistant", "content": "Hi!"},
            ]
        },
        {"messages": "oops"},
    ]
    jsonl(root / "prompts_repo" / "eval.jsonl", prompts)
    return {
        k: str(root / k)
        for k in ("outs_dict", "ref_single", "parquet_repo", "prefs_repo", "prompts_repo")
    }


def run(bin: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(bin / args[0]), *args[1:]],
        capture_output=True,
        timeout=300,
        env={**os.environ, **OFFLINE},
        cwd=cwd,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", type=Path, required=True)
    args = parser.parse_args()
    bin = args.bin.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        d = build(root)
        annotate = ("farm-annotate", "--pool", "sim_eval_offline", "--no-cache")

        def generators(done):
            return [orjson.loads(x)["generator_2"] for x in done.stdout.splitlines()]

        cases = [
            (
                "annotate: saved DatasetDict with :validation, reference a saved Dataset",
                (*annotate, f"{d['outs_dict']}:validation", "--reference", d["ref_single"]),
                lambda done: done.returncode == 0 and len(generators(done)) == 4,
            ),
            (
                "annotate: folder of parquet shards, --split validation, reference :train",
                (
                    *annotate,
                    d["parquet_repo"],
                    "--split",
                    "validation",
                    "--reference",
                    f"{d['ref_single']}:train",
                ),
                lambda done: done.returncode == 0 and len(generators(done)) == 4,
            ),
            (
                "annotate: saved DatasetDict with no split named reads train (1 row)",
                (*annotate, d["outs_dict"], "--reference", d["ref_single"]),
                lambda done: done.returncode == 0 and len(generators(done)) == 1,
            ),
            (
                "rm-train: folder of jsonl, bad row named FILE:2",
                ("farm-rm-train", "embedded", d["prefs_repo"], "-o", str(root / "rm")),
                lambda done: (
                    done.returncode == 1
                    and f"{d['prefs_repo']}/data/train.jsonl:2:" in done.stderr.decode()
                ),
            ),
            (
                "dpo: the same, with an explicit :train",
                ("farm-dpo", "embedded", f"{d['prefs_repo']}:train", "-o", str(root / "dpo")),
                lambda done: (
                    done.returncode == 1
                    and f"{d['prefs_repo']}/data/train.jsonl:2:" in done.stderr.decode()
                ),
            ),
            (
                "sft: messages rows in a folder (eval.jsonl is datasets' test split), --split test",
                (
                    "farm-sft",
                    "embedded",
                    d["prompts_repo"],
                    "--split",
                    "test",
                    "-o",
                    str(root / "sft"),
                ),
                lambda done: (
                    done.returncode == 1
                    and f"{d['prompts_repo']}/eval.jsonl:2:" in done.stderr.decode()
                ),
            ),
            (
                "sample: offline name not cached, clear exit 1",
                ("farm-sample", "embedded", "HuggingFaceH4/ultrachat_200k:train_sft"),
                lambda done: (
                    done.returncode == 1
                    and "not in the local cache" in done.stderr.decode()
                    and b"Traceback" not in done.stderr
                ),
            ),
            (
                "sft: offline name with no owner, not cached",
                ("farm-sft", "embedded", "imdb", "-o", str(root / "sft2")),
                lambda done: (
                    done.returncode == 1
                    and "imdb: cannot open" in done.stderr.decode()
                    and "local cache" in done.stderr.decode()
                ),
            ),
            (
                "annotate: a missing plain file keeps 'cannot open' naming it",
                (*annotate, "no/such/outputs.json.gz"),
                lambda done: (
                    done.returncode == 1
                    and "no/such/outputs.json.gz: cannot open: No such file" in done.stderr.decode()
                ),
            ),
            (
                "annotate: a split that is not there lists the ones that are",
                (*annotate, f"{d['outs_dict']}:test", "--reference", d["ref_single"]),
                lambda done: (
                    done.returncode == 1
                    and "validation" in done.stderr.decode()
                    and "train" in done.stderr.decode()
                    and b"Traceback" not in done.stderr
                ),
            ),
        ]
        passed = 0
        for title, command, check in cases:
            done = run(bin, *command, cwd=root)
            ok = check(done)
            passed += ok
            last = (done.stderr.decode().strip().splitlines() or [""])[-1][:160]
            print(f"{'PASS' if ok else 'FAIL'}  {title}  [exit {done.returncode}] {last}")
        print(f"{passed}/{len(cases)} cases pass")


if __name__ == "__main__":
    main()
