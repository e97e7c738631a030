"""Audit of issue 22 (inputs), with cases of its own (not the tests'): run it against a checkout of
farmkit (`--root`, default this one) to compare the code before and after the fixes.

    python bench/audit_inputs.py --root /path/to/checkout --tiny-model DIR > figures.jsonl

Each case prints one JSON line: what was run, the exit code, the seconds it took, the peak memory
(the child's max RSS) and the lines of stderr that matter. It loads at most a tiny random model
(given with --tiny-model: a folder with a 1,024-token context, as tests/conftest.py builds one).
"""

from __future__ import annotations

import argparse
import codecs
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def run(root: Path, tool: str, *args: str, umask: int | None = None) -> dict:
    """A farm-* tool from the checkout `root`, in a subprocess of its own."""
    module = "tools." + tool.replace("-", "_")
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=root,
        env=env,
        capture_output=True,
        timeout=900,
        preexec_fn=(lambda: os.umask(umask)) if umask is not None else None,
    )
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {
        "code": done.returncode,
        "seconds": round(seconds, 2),
        # the max over children so far: a rise means this child set a new peak
        "peak_mb_so_far": round(max(peak, before) / 1024),
        "stdout_lines": len(done.stdout.splitlines()),
        "stderr": [
            line
            for line in done.stderr.decode("utf-8", "replace").splitlines()
            if line.strip() and "it/s" not in line and "s/it" not in line
        ][-6:],
        "stdout": done.stdout,
    }


def report(case: str, result: dict, **extra) -> None:
    shown = {k: v for k, v in result.items() if k != "stdout"}
    print(json.dumps({"case": case, **shown, **extra}, ensure_ascii=False), flush=True)


def jsonl(path: Path, rows) -> Path:
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rows))
    return path


def long_prompts(root: Path, work: Path, tiny: Path) -> None:
    prompts = [
        {"instruction": "List three colours."},
        # a pasted book chapter (~300 KB of prose) and a 30 MB run of CJK text
        {"instruction": ("The quick brown fox jumps over the lazy dog. " * 7000) + "Summarize."},
        {"instruction": "Name a fruit."},
        {"instruction": "数据" * 15_000_000 + "总结一下。"},
    ]
    mixed, plain = jsonl(work / "mixed.jsonl", prompts), jsonl(work / "plain.jsonl", prompts[::2])
    common = ["-n", "1", "--temperature", "0", "--max-new-tokens", "8", "--backend", "hf"]
    base = run(root, "farm-sample", str(tiny), str(plain), *common)
    report("long prompts: two ordinary prompts alone", base)
    for mode in (None, "fail", "skip", "truncate"):
        extra = [] if mode is None else ["--long-prompts", mode]
        result = run(root, "farm-sample", str(tiny), str(mixed), *common, *extra)
        report(
            f"long prompts: 300 KB and 30 MB prompts among them, {mode or 'default'}",
            result,
            time_ratio=round(result["seconds"] / base["seconds"], 2),
        )


def boards(root: Path, work: Path) -> None:
    good = jsonl(
        work / "good.jsonl", [{"generator": g, "win_rate": s} for g, s in (("a b", 1), ("c", 2))]
    )
    csv = 'Model,"win_rate"\n"a b",10\nc,20\n'
    (work / "board16be.csv").write_bytes(codecs.BOM_UTF16_BE + csv.encode("utf-16-be"))
    report("UTF-16 BE board", run(root, "farm-correlate", str(good), str(work / "board16be.csv")))
    (work / "photo.csv").write_bytes(
        b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01" + bytes(range(256))
    )
    report(
        "a JPEG given as a board", run(root, "farm-correlate", str(good), str(work / "photo.csv"))
    )
    (work / "latin1.csv").write_bytes("Model,win_rate\nm\xe9lange,3\n".encode("latin-1"))
    report("a Latin-1 board", run(root, "farm-correlate", str(good), str(work / "latin1.csv")))
    judge = jsonl(work / "judge.jsonl", [{"pair_id": i, "preference": "error"} for i in range(5)])
    report("judge file of failed parses only", run(root, "farm-correlate", "--judge", str(judge)))
    history = jsonl(
        work / "history.jsonl",
        [
            {"evaluated_at": "2026-02-01T00:00:00Z", "generator": "m", "win_rate": 50.0},
            {"evaluated_at": "2026-02-02T00:00:00Z", "generator": ["m"], "win_rate": 51.0},
        ],
    )
    report(
        "history entry with a list as generator",
        run(root, "farm-plot", "history", str(history), "-o", str(work / "h.png")),
    )


def bad_records(root: Path, work: Path) -> None:
    hh = SHARED / "human_prefs" / "hh_rlhf_harmless_base_test.jsonl.gz"
    if hh.exists():
        for extra in ([], ["--on-error", "skip"]):
            result = run(root, "farm-convert", str(hh), "--kind", "preference", *extra)
            report(f"hh-rlhf harmless-base test {' '.join(extra) or '(default)'}", result)
    rows = [
        {"instruction": f"q{i}", "generator_1": "ref", "generator_2": "m", "preference": 2}
        for i in range(20)
    ]
    path = work / "prefs.jsonl.gz"
    lines = [json.dumps(r).encode() for r in rows]
    lines[7] = json.dumps({**rows[7], "preference": 7}).encode()  # outside [1, 2]
    lines[12] = b'{"instruction": "q12", "gener'  # a line cut short
    with gzip.open(path, "wb") as stream:
        stream.write(b"\n".join(lines) + b"\n")
    for extra in ([], ["--on-error", "skip"]):
        result = run(root, "farm-winrate", str(path), "--no-length-control", *extra)
        report(f"farm-winrate, 2 bad of 20 {' '.join(extra) or '(default)'}", result)


def round_trip(root: Path, work: Path) -> None:
    """Real texts: AlpacaFarm's RLHF and SFT outputs, the RLHF one preferred on 80% of items."""
    folder = SHARED / "alpaca" / "alpaca_farm_examples"
    if not folder.exists():
        return
    rlhf = json.loads((folder / "outputs_rlhf.json").read_text())
    sft = json.loads((folder / "outputs_sft.json").read_text())
    prefs = [
        {
            "instruction": a["instruction"],
            "input": a["input"],
            "output_1": b["output"],
            "output_2": a["output"],
            "generator_1": "sft10k",
            "generator_2": "rlhf_ppo",
            "preference": 2 if i % 5 else (1 if i % 2 else 1.3),
        }
        for i, (a, b) in enumerate(zip(rlhf[:60], sft[:60], strict=True))
    ]
    source = jsonl(work / "rt.jsonl", prefs)
    for target in ("trl", "trl-chat"):
        out = work / f"rt.{target}.parquet"
        run(root, "farm-convert", str(source), "--to", target, "-o", str(out))
        back = run(root, "farm-convert", str(out))
        restored = [json.loads(line) for line in back["stdout"].splitlines()]
        before = run(root, "farm-winrate", str(source), "--no-length-control")
        (work / "back.jsonl").write_bytes(back["stdout"])
        after = run(root, "farm-winrate", str(work / "back.jsonl"), "--no-length-control")

        def board(result):
            return [
                (row["generator"], row.get("reference"), row["win_rate"])
                for row in map(json.loads, result["stdout"].splitlines())
            ]

        report(
            f"farmkit -> {target} (Parquet) -> farmkit, 60 real pairs",
            back,
            same_records=restored == prefs,
            records_differing=sum(a != b for a, b in zip(restored, prefs, strict=False)),
            board_before=board(before),
            board_after=board(after),
        )


def unnamed_outputs(root: Path, work: Path) -> None:
    folder = SHARED / "alpaca" / "alpaca_farm_examples"
    if not folder.exists():
        return
    reference = work / "outputs_baseline.json"
    reference.write_text((folder / "outputs_baseline.json").read_text())
    policy = work / "outputs_rlhf.json"
    policy.write_text(json.dumps(json.loads((folder / "outputs_rlhf.json").read_text())[:10]))
    result = run(
        root,
        "farm-annotate",
        "--pool",
        "gold",
        "--no-cache",
        "--reference",
        str(reference),
        str(policy),
    )
    names = sorted({json.loads(line).get("generator_2") for line in result["stdout"].splitlines()})
    report("farm-annotate on AlpacaFarm outputs without generator", result, generator_2=names)


def weights_mode(root: Path, work: Path) -> None:
    script = (
        "import os, sys, torch\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "from farmkit.lm.modelio import save_model_folder\n"
        "class Tok:\n"
        "    def save_pretrained(self, folder):\n"
        "        open(os.path.join(folder, 'tokenizer.json'), 'w').write('{}')\n"
        "config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,\n"
        "    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)\n"
        "save_model_folder(sys.argv[1], LlamaForCausalLM(config), Tok(), {'kind': 'policy'})\n"
    )
    for umask in (0o002, 0o027):
        target = work / f"model-{umask:03o}"
        subprocess.run(
            [sys.executable, "-c", script, str(target)],
            cwd=root,  # `-c` puts the working folder first on sys.path
            env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"},
            check=True,
            capture_output=True,
            preexec_fn=lambda umask=umask: os.umask(umask),
        )
        modes = {p.name: oct(p.stat().st_mode & 0o777) for p in sorted(target.iterdir())}
        print(json.dumps({"case": f"model folder under umask {umask:03o}", "modes": modes}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--tiny-model", type=Path, required=True)
    parser.add_argument("--only", default="")
    options = parser.parse_args()
    cases = {
        "boards": boards,
        "bad_records": bad_records,
        "round_trip": round_trip,
        "unnamed_outputs": unnamed_outputs,
        "weights_mode": weights_mode,
    }
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        for name, case in cases.items():
            if not options.only or name in options.only.split(","):
                case(options.root.resolve(), work)
        if not options.only or "long_prompts" in options.only.split(","):
            long_prompts(options.root.resolve(), work, options.tiny_model.resolve())


if __name__ == "__main__":
    main()
