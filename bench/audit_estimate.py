"""Audit of farm-annotate's token estimate (not a test): estimate_tokens against a real tokenizer,
per script, on texts it was not tuned on.

    .venv/bin/python bench/audit_estimate.py [--cost FILE] [--runs [--src DIR]]

The real tokenizer is the embedded model's (SmolLM2, a byte-level BPE, offline). The texts are model
outputs from the AlpacaEval files in /work/shared/data (or $FARMKIT_DATA): answers all in ASCII
(Latin script), the CJK passages of answers (mostly Hangul, some Han), the code blocks of answers,
and a few Cyrillic and emoji-heavy lines written for this audit (the data has no real Cyrillic).
`--cost FILE` takes estimate_tokens from another copy of farmkit/lm/tokens.py (or of
farmkit/annotate/cost.py, where it lived before issue 38: the unfixed one, to compare). Prints, per
script, the estimate / real ratio: median, 5th and 95th percentile, min and max, over texts of 20
tokens or more.

`--runs` also compares, per script, what `farm-annotate --estimate` expects for 40 pairs of such texts
with what the loopback server (tests/openai_server.py) bills for them when it counts tokens with the
same tokenizer (plus 5 tokens of chat template a message); `--src DIR` runs farmkit from another tree.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import os
import re
import statistics
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("FARMKIT_DATA", "/work/shared/data")) / "alpaca_eval" / "model_outputs"
_CJK = "\u3000-\u30ff\u3400-\u9fff\uac00-\ud7af\uff00-\uffef"
CJK_PASSAGE = re.compile(f"[{_CJK}][{_CJK}\\s0-9,.!?;:()]{{30,}}")
FENCE = re.compile(r"```[\w+-]*\n(.*?)```", re.DOTALL)
# the data's Cyrillic is degenerate output (a letter repeated): real sentences written for this audit
CYRILLIC = [
    "Весной в нашем саду расцветают яблони, и по утрам слышно, как поют птицы.",
    "Чтобы сменить пароль, откройте настройки профиля и нажмите «Безопасность».",
    "Поезд до Новосибирска отправляется в 23:40 с третьего пути; билеты можно купить онлайн.",
    "Учёные обнаружили, что короткие прогулки после еды помогают снизить уровень сахара в крови.",
    "Будь ласка, надішліть звіт до п'ятниці, щоб ми встигли його перевірити.",
    "Книгата, която ми препоръча, се оказа много интересна и я прочетох за два дни.",
    "Если код не компилируется, проверьте версию компилятора и пути к библиотекам.",
    "Мы благодарим всех участников конференции и надеемся увидеть вас в следующем году!",
]
EMOJI = [
    "Packing list for the beach 🏖️: towel 🧺, sunscreen 🧴, snacks 🍉🍪 and a good book 📚!",
    "Congrats on the new job!!! 🥳🥳🎊 So proud of you 💪💯 Let's celebrate soon 🍾🥂",
    "Mood board: 🌸🌼🌻🌺🌷 spring colours, 🐝 bees and 🦋 butterflies everywhere ✨✨",
    "Status: 🟢 api 🟢 db 🟡 cache (slow) 🔴 search: paging on-call 📟 now",
    "Recipe rating ⭐⭐⭐⭐☆ — the soup 🍲 was great, bread 🥖 a bit dry 😅",
    "Travel plan ✈️ Paris 🇫🇷 → Rome 🇮🇹 → Athens 🇬🇷, back home 🏠 by the 20th",
    "Team retro: what went well 👍 shipping on time 🚢; to improve 👎 flaky tests 🧪🐛",
    "👨‍👩‍👧‍👦 family dinner tonight 🍝 then a movie 🎬🍿 — who's in? 🙋‍♀️🙋‍♂️",
]


def tokenizer():
    from tokenizers import Tokenizer

    from farmkit.lm.models import resolve

    real = Tokenizer.from_file(str(Path(resolve("embedded")) / "tokenizer.json"))
    return lambda text: len(real.encode(text, add_special_tokens=False).ids)


def texts() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {"latin": [], "cjk": [], "code": []}
    for path in sorted(DATA.glob("*.jsonl.gz")):
        for line in gzip.open(path).read().splitlines():
            output = orjson.loads(line).get("output") or ""
            found["code"].extend(block for block in FENCE.findall(output) if len(block) > 80)
            # passages in one script (answers that translate or quote mix it with English)
            found["cjk"].extend(CJK_PASSAGE.findall(output))
            if "```" not in output and output.isascii() and len(found["latin"]) < 2000:
                found["latin"].append(output)
    found["cyrillic"], found["emoji"] = CYRILLIC, EMOJI
    return found


def load(path: str | None):
    if path is None:
        from farmkit.lm.tokens import estimate_tokens

        return estimate_tokens
    spec = importlib.util.spec_from_file_location("cost_under_audit", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.estimate_tokens


def runs(found: dict[str, list[str]], count, src: str | None) -> None:
    import subprocess
    import sys
    import tempfile

    sys.path.insert(0, str(ROOT / "tests"))
    from openai_server import OpenAIServer, judge_longer

    command = [sys.executable, "-c", "from farmkit.tools.farm_annotate import cli; cli()"]
    env = dict(os.environ, OPENAI_API_KEY="audit")
    if src:
        env["PYTHONPATH"] = src
    with tempfile.TemporaryDirectory() as tmp:
        prices = Path(tmp) / "prices.yaml"
        prices.write_text("audit-model: {prompt: 1000, completion: 1000}\n")
        pool = Path(tmp) / "pool.yaml"
        pool.write_text(
            "name: audit\nflip_rate: 0.0\nsettings: {concurrency: 8}\njudges:\n"
            "  - {name: j, backend: openai, model: audit-model, prompt: plain, batch_size: 1, "
            "temperature: 0.0, max_tokens: 20}\n"
        )
        args = ["--pool", str(pool), "--prices", str(prices), "--no-cache", "-q"]
        for script, group in found.items():
            texts = [t for t in group if len(t) < 4000][:80]
            data = b"".join(
                orjson.dumps(
                    {"instruction": texts[i][:200], "output_1": texts[i], "output_2": texts[-1 - i]}
                )
                + b"\n"
                for i in range(min(40, len(texts) // 2))
            )
            with OpenAIServer(respond=judge_longer, billing=lambda t: count(t) + 5) as server:
                env["OPENAI_BASE_URL"] = server.url
                expected = orjson.loads(
                    subprocess.run(
                        command + args + ["--estimate"],
                        input=data,
                        env=env,
                        capture_output=True,
                        cwd=src or ROOT,  # python -c puts the working directory first on sys.path
                    ).stdout
                )
                subprocess.run(
                    command + args, input=data, env=env, capture_output=True, cwd=src or ROOT
                )
                billed = sum(p for p, _ in server.billed)
            print(
                f"{script:9s} --estimate prompt tokens / billed: "
                f"{expected['prompt_tokens']} / {billed} = {expected['prompt_tokens'] / billed:.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--cost", help="another tokens.py (or an older cost.py) to take estimate_tokens from"
    )
    parser.add_argument("--runs", action="store_true", help="also compare --estimate with bills")
    parser.add_argument("--src", help="with --runs: run farmkit from this tree")
    args = parser.parse_args()
    estimate, count = load(args.cost), tokenizer()
    found = texts()
    for script, group in found.items():
        ratios = []
        for text in group:
            real = count(text)
            if real >= 20 or script == "emoji":
                ratios.append(estimate(text) / real)
        ratios.sort()

        def at(q: float, ratios: list[float] = ratios) -> float:
            return ratios[min(len(ratios) - 1, int(q * len(ratios)))]

        print(
            f"{script:9s} n={len(ratios):4d} estimate/real median {statistics.median(ratios):.2f} "
            f"p5 {at(0.05):.2f} p95 {at(0.95):.2f} min {ratios[0]:.2f} max {ratios[-1]:.2f}"
        )
    if args.runs:
        runs(found, count, args.src)


if __name__ == "__main__":
    main()
