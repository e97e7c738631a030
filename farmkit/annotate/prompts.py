"""Judge prompts: the template files in prompts/, filled in one pass, and the parsers that read the
verdicts back out of a completion.

A template file starts with `format: plain|json|ranking|choice` and has sections:
`[system]`, `[user]` (with `{examples}`, `{count}` and `{pairs}`), `[pair]` (one compared pair:
`{index}`, `{instruction}`, `{input}`, `{output_a}`, `{output_b}`), `[input]` (how a non-empty input
is shown) and, for `choice` templates read by the local backend, `[answer]` (the start of the reply).

Filling is a single regex pass over the template: each placeholder is replaced by its value and the
values are never scanned again, so an answer that contains `{output_b}` or a fake verdict line
cannot change the prompt's structure. Parsers read only the completion, and take the last verdict
given for a pair, so an answer quoted in a rationale cannot cast a vote either.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import re
from dataclasses import dataclass
from pathlib import Path

from farmkit.io import FarmError

FORMATS = ("plain", "json", "ranking", "choice")
SECTIONS = ("system", "user", "pair", "input", "answer")
PLACEHOLDER = re.compile(r"\{(examples|count|pairs|index|instruction|input|output_a|output_b)\}")



@dataclass(frozen=True)
class Example:
    """One worked example (prompts/examples.yaml): a pair, the better answer (A or B) and why."""

    instruction: str
    input: str
    a: str
    b: str
    better: str
    why: str


@functools.cache
def worked_examples() -> tuple[Example, ...]:
    """The shipped worked examples, in order; those a judge is shown are part of its cache key."""
    import yaml

    text = importlib.resources.files("farmkit.annotate").joinpath("prompts", "examples.yaml").read_text(encoding="utf-8")
    rows = yaml.safe_load(text)
    examples = []
    for number, row in enumerate(rows, start=1):
        try:
            example = Example(**{key: str(row.get(key) or "") for key in ("instruction", "input", "a", "b", "better", "why")})
        except (AttributeError, TypeError) as error:  # pragma: no cover - the shipped file is tested
            raise FarmError(f"prompts/examples.yaml: example {number}: {error}") from None
        if example.better not in ("A", "B") or not (example.instruction and example.a and example.b):
            raise FarmError(f"prompts/examples.yaml: example {number}: expected instruction, a, b and better: A or B")
        examples.append(example)
    return tuple(examples)


@dataclass(frozen=True)
class Shown:
    """One pair as a judge sees it: answer A is shown first."""

    instruction: str
    input: str
    output_a: str
    output_b: str


@dataclass(frozen=True)
class Template:
    name: str
    format: str
    sections: dict[str, str]
    text: str  # the whole file, part of every cache key

    def messages(self, pairs: list[Shown], examples: int = 0) -> list[dict[str, str]]:
        """Chat messages asking for verdicts on `pairs` (shown in order), after `examples` worked examples."""
        if self.format == "choice":
            if len(pairs) != 1:
                raise ValueError("a choice template judges one pair at a time")
            user = self._pair_text(self.sections["user"], 1, pairs[0])
        else:
            blocks = "".join(self._pair_text(self.sections["pair"], i, p) for i, p in enumerate(pairs, start=1))
            user = fill(self.sections["user"], {"examples": self._examples(examples), "count": str(len(pairs)), "pairs": blocks})
        system = self.sections.get("system", "").strip()
        messages = [{"role": "system", "content": system}] if system else []
        return messages + [{"role": "user", "content": user.strip() + "\n"}]

    def _pair_text(self, section: str, index: int, pair: Shown) -> str:
        shown_input = fill(self.sections["input"], {"input": pair.input}) if pair.input else ""
        values = {"index": str(index), "instruction": pair.instruction, "input": shown_input,
                  "output_a": pair.output_a, "output_b": pair.output_b}
        return fill(section, values)

    def _examples(self, count: int) -> str:
        if count <= 0:
            return ""
        available = worked_examples()
        if count > len(available):
            raise FarmError(f"a judge asks for {count} worked examples; prompts/examples.yaml has {len(available)}")
        parts = ["Worked examples of the task and the expected reply:\n"]
        for number, example in enumerate(available[:count], start=1):
            block = self._pair_text(self.sections["pair"], 1, Shown(example.instruction, example.input, example.a, example.b))
            verdict = render_verdicts(self.format, [(example.better, example.why)])
            parts.append(f"Example {number}:\n{block}Expected reply:\n{verdict}\n")
        return "\n".join(parts) + "\nNow the real task.\n\n"

    @property
    def answer_prefix(self) -> str:
        return self.sections.get("answer", "").strip()


def fill(template: str, values: dict[str, str]) -> str:
    """Replace every known placeholder in one pass; values are inserted verbatim, never re-scanned."""
    return PLACEHOLDER.sub(lambda match: values.get(match.group(1), match.group(0)), template)


def render_verdicts(format: str, verdicts: list[tuple[str, str]]) -> str:
    """The reply a perfect judge would write, in a template's format (for the worked examples)."""
    if format == "json":
        entries = [{"pair": i, "rationale": why, "better": better} for i, (better, why) in enumerate(verdicts, start=1)]
        return json.dumps({"verdicts": entries})
    if format == "ranking":
        return "\n".join(f"Pair {i}: {b} > {'B' if b == 'A' else 'A'}" for i, (b, _) in enumerate(verdicts, start=1))
    return "\n".join(f"Pair {i}: {b}" for i, (b, _) in enumerate(verdicts, start=1))


def parse_template(name: str, text: str) -> Template:
    lines = text.splitlines()
    if not lines or not lines[0].startswith("format:"):
        raise FarmError(f"prompt template {name}: the first line must be `format: {'|'.join(FORMATS)}`")
    format = lines[0].split(":", 1)[1].strip()
    if format not in FORMATS:
        raise FarmError(f"prompt template {name}: unknown format {format!r}; expected one of {', '.join(FORMATS)}")
    sections: dict[str, list[str]] = {}
    current = None
    for line in lines[1:]:
        header = re.fullmatch(r"\[(\w+)\]", line.strip())
        if header and header.group(1) in SECTIONS:
            current = header.group(1)
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    joined = {key: "\n".join(value) + "\n" for key, value in sections.items()}
    required = ("user", "input") if format == "choice" else ("user", "pair", "input")
    missing = [section for section in required if section not in joined]
    if missing:
        raise FarmError(f"prompt template {name}: missing section(s) {', '.join(missing)}")
    if format != "choice" and "{pairs}" not in joined["user"]:
        raise FarmError(f"prompt template {name}: the [user] section must contain {{pairs}}")
    return Template(name, format, joined, text)


@functools.cache
def load_template(name: str) -> Template:
    """A template file path, or a shipped template by name (prompts/NAME.txt)."""
    path = Path(name)
    if path.suffix == ".txt" and path.is_file():
        return parse_template(path.stem, path.read_text(encoding="utf-8"))
    shipped = importlib.resources.files("farmkit.annotate").joinpath("prompts", f"{name}.txt")
    if "/" in name or not shipped.is_file():
        raise FarmError(f"no prompt template {name!r}: not a shipped template ({', '.join(shipped_templates())}) nor a .txt file")
    return parse_template(name, shipped.read_text(encoding="utf-8"))


def shipped_templates() -> list[str]:
    folder = importlib.resources.files("farmkit.annotate").joinpath("prompts")
    return sorted(entry.name[:-4] for entry in folder.iterdir() if entry.name.endswith(".txt"))


# ---------------------------------------------------------------------------------------------
# Parsing. A verdict is "A", "B" or "tie" for the pair as shown; None when the completion gives none.

_LETTER = r"\W{0,3}(?:answer|response|reply|output)?\s*\(?([ab]|tie)\)?\W{0,3}"
_PLAIN = re.compile(r"^\W*(?:pair|set|comparison)\s*(\d+)\W*?[:=\-]" + _LETTER + r"$", re.IGNORECASE | re.MULTILINE)
_RANK = re.compile(r"^\W*(?:pair|set|comparison)\s*(\d+)\W*?[:=\-]\s*\W*([ab])\W*\s*(>|<|=)\s*\W*([ab])\W*$",
                   re.IGNORECASE | re.MULTILINE)
_BARE = re.compile(r"^\W*(?:answer|response)?\s*\(?([ab])\)?\W*$", re.IGNORECASE)


def parse_verdicts(format: str, completion: str, count: int) -> tuple[list[str | None], str | None]:
    """Verdicts for pairs 1..count from a completion, and a reason when some are missing."""
    found: dict[int, str] = {}
    if format == "json":
        found = _parse_json(completion)
    elif format == "ranking":
        for match in _RANK.finditer(completion):
            first, relation, second = match.group(2).upper(), match.group(3), match.group(4).upper()
            if first == second:
                continue
            if relation == "=":
                found[int(match.group(1))] = "tie"
            else:
                found[int(match.group(1))] = first if relation == ">" else second
    else:
        for match in _PLAIN.finditer(completion):
            found[int(match.group(1))] = match.group(2).lower() if match.group(2).lower() == "tie" else match.group(2).upper()
        if not found and count == 1:
            bare = _BARE.match(completion.strip())
            if bare:
                found[1] = bare.group(1).upper()
    verdicts = [found.get(index) for index in range(1, count + 1)]
    missing = [str(index) for index, verdict in enumerate(verdicts, start=1) if verdict is None]
    if not missing:
        return verdicts, None
    if not completion.strip():
        return verdicts, "empty completion"
    if not found:
        return verdicts, f"no verdict could be parsed from the completion ({format} format)"
    return verdicts, f"the completion gave no verdict for pair(s) {', '.join(missing)} of {count}"


def _parse_json(completion: str) -> dict[int, str]:
    start = completion.find("{")
    list_start = completion.find("[")
    if start < 0 and list_start < 0:
        return {}
    begin = min(index for index in (start, list_start) if index >= 0)
    try:
        value, _ = json.JSONDecoder().raw_decode(completion[begin:])
    except ValueError:
        return {}
    entries = value.get("verdicts") if isinstance(value, dict) else value
    if isinstance(value, dict) and entries is None and "better" in value:
        entries = [{"pair": 1, **value}]
    found: dict[int, str] = {}
    if not isinstance(entries, list):
        return found
    for position, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict):
            continue
        better = str(entry.get("better", "")).strip().upper()
        pair = entry.get("pair", position)
        if better in ("A", "B", "TIE") and isinstance(pair, (int, str)) and str(pair).isdigit():
            found[int(pair)] = "tie" if better == "TIE" else better
    return found
