"""Audit of key leaks (not a test): farm-annotate runs against a loopback server that echoes the API
key back, and a search of everything the runs wrote for the key or any 8-character piece of it.

    .venv/bin/python bench/audit_secrets.py [--src DIR]

Cases (fresh, not the tests' own): the key inside a word, in a JSON rationale, cut into 9-character
lines, as `api_key=...`, its second half alone, in every error message and an `X-Echo-Key` header
(the server's `echo_key`), with faults (400, 429, 500, malformed replies) and a rejected key (401).
Each case runs with -v, -o FILE and --cache FILE; the files, stdout and stderr are searched. `--src
DIR` runs farmkit from another tree (e.g. the unfixed code). Prints, per case, the places that held
the key and a summary: cases that leaked, and files that held it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from openai_server import OpenAIServer, judge_longer  # noqa: E402

KEY = "sk-live-4Hq9TzWm2Rb7Yp1Ncx8VkL3e"


def chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


LEAKS = {
    "inside a word": f"cannot decide:x{KEY}y",
    "json rationale": '{"verdicts": [{"pair": 1, "rationale": "key ' + KEY + '", "better": "?"}]}',
    "cut in lines": "\n".join(chunks(KEY, 9)),
    "api_key=": f"debug: api_key={KEY}&model=x",
    "second half": f"...{KEY[len(KEY) // 2 :]}",
}


def run(src, args, env, data):
    command = [sys.executable, "-c", "from farmkit.tools.farm_annotate import cli; cli()"]
    full = dict(os.environ, **env)
    if src:
        full["PYTHONPATH"] = src
    return subprocess.run(
        command + args, input=data, env=full, capture_output=True, timeout=300, cwd=src or ROOT
    )


def found(blob: bytes) -> list[str]:
    text = blob.decode("utf-8", "replace")
    return sorted({KEY[i : i + 8] for i in range(len(KEY) - 7) if KEY[i : i + 8] in text})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--src")
    args = parser.parse_args()
    leaked_cases, places = 0, set()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        pool = tmp / "pool.yaml"
        pool.write_text(
            "name: audit\nflip_rate: 0.0\n"
            "settings: {timeout: 2.0, backoff: 0.01, max_retries: 2, concurrency: 3, parse_retries: 1}\n"
            "judges:\n  - {name: j, backend: openai, model: m, prompt: plain, batch_size: 2, "
            "temperature: 0.0, max_tokens: 60}\n"
        )
        pairs = b"".join(
            orjson.dumps(
                {"instruction": f"Q{i} {name}?", "output_1": "short", "output_2": "a longer one"}
            )
            + b"\n"
            for i, name in enumerate([*LEAKS, "plain", "plain", "plain"])
        )
        cases = [(name, leak, None) for name, leak in LEAKS.items()]
        cases.append(("faults", None, ["400", "429", "500", "null_choice", "plain"]))
        cases.append(("rejected key", None, None))
        for number, (name, leak, script) in enumerate(cases):

            def respond(body, leak=leak):
                text = body["messages"][-1]["content"]
                if leak is not None and any(f"{n}?" in text for n in LEAKS):
                    return leak
                return judge_longer(body)

            work = tmp / f"case{number}"
            work.mkdir()
            server = OpenAIServer(
                respond=respond,
                echo_key=True,
                script=script,
                api_key="something-else" if name == "rejected key" else None,
            )
            with server:
                done = run(
                    args.src,
                    [
                        "--pool",
                        str(pool),
                        "-v",
                        "-o",
                        str(work / "out.jsonl"),
                        "--cache",
                        str(work / "cache.sqlite"),
                    ],
                    {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": KEY},
                    pairs,
                )
            blobs = {path.name: path.read_bytes() for path in work.iterdir()}
            blobs |= {"stdout": done.stdout, "stderr": done.stderr}
            hits = {place: found(blob) for place, blob in blobs.items() if found(blob)}
            leaked_cases += bool(hits)
            places |= set(hits)
            print(
                f"{name:15s} exit={done.returncode} "
                + (", ".join(f"{p}: {len(h)} pieces" for p, h in hits.items()) or "clean"),
                flush=True,
            )
    print(f"SUMMARY: {leaked_cases} of {len(cases)} cases leaked the key; in {sorted(places)}")


if __name__ == "__main__":
    main()
