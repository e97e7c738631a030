"""Judge prompts: the template files in prompts/, filled in one pass, and the parsers that read the
verdicts back out of a completion.

A template file starts with `format: plain|json|ranking|choice` and has sections:
`[system]`, `[user]` (with `{examples}`, `{count}` and `{pairs}`), `[pair]` (one compared pair:
`{index}`, `{instruction}`, `{input}`, `{output_a}`, `{output_b}`), `[input]` (how a non-empty input
is shown) and, for `choice` templates read by the local backend, `[answer]` (the start of the reply).

Filling is a single regex pass over the template: each placeholder is replaced by its value and the
values are never scanned again, so an answer that contains `{output_b}` or a fake verdict line
cannot change the prompt's structure, and an answer's copies of the template's delimiters are
broken (a zero-width space) so it cannot close its frame. Parsers read only the judge's own words
(see Parsing below) and give no verdict rather than guess between conflicting ones.
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
# bump when a parser reads a completion differently: cached verdicts of the old parsers are then asked again
PARSER_VERSION = 2
ZERO_WIDTH_SPACE = "\u200b"
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

    text = (
        importlib.resources.files("farmkit.annotate")
        .joinpath("prompts", "examples.yaml")
        .read_text(encoding="utf-8")
    )
    rows = yaml.safe_load(text)
    examples = []
    for number, row in enumerate(rows, start=1):
        try:
            example = Example(
                **{
                    key: str(row.get(key) or "")
                    for key in ("instruction", "input", "a", "b", "better", "why")
                }
            )
        except (
            AttributeError,
            TypeError,
        ) as error:  # pragma: no cover - the shipped file is tested
            raise FarmError(f"prompts/examples.yaml: example {number}: {error}") from None
        if example.better not in ("A", "B") or not (
            example.instruction and example.a and example.b
        ):
            raise FarmError(
                f"prompts/examples.yaml: example {number}: expected instruction, a, b and better: A or B"
            )
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
            blocks = "".join(
                self._pair_text(self.sections["pair"], i, p) for i, p in enumerate(pairs, start=1)
            )
            user = fill(
                self.sections["user"],
                {"examples": self._examples(examples), "count": str(len(pairs)), "pairs": blocks},
            )
        system = self.sections.get("system", "").strip()
        messages = [{"role": "system", "content": system}] if system else []
        return messages + [{"role": "user", "content": user.strip() + "\n"}]

    def _pair_text(self, section: str, index: int, pair: Shown) -> str:
        shown_input = (
            fill(self.sections["input"], {"input": self._defused(pair.input)}) if pair.input else ""
        )
        values = {
            "index": str(index),
            "instruction": self._defused(pair.instruction),
            "input": shown_input,
            "output_a": self._defused(pair.output_a),
            "output_b": self._defused(pair.output_b),
        }
        return fill(section, values)

    @functools.cached_property
    def delimiters(self) -> tuple[str, ...]:
        """The texts that frame an answer in this template: the lines around an answer placeholder
        that stands alone on its line (`<answer A>`, triple quotes), or the words beside one that does not
        (`Answer A:`)."""
        section = self.sections["user" if self.format == "choice" else "pair"]
        lines = [line.strip() for line in section.splitlines()]
        found: list[str] = []
        for number, line in enumerate(lines):
            if not re.search(r"\{output_[ab]\}", line):
                continue
            if line in ("{output_a}", "{output_b}"):
                found += [
                    lines[n] for n in (number - 1, number + 1) if 0 <= n < len(lines) and lines[n]
                ]
            else:
                found += [
                    part.strip()
                    for part in re.split(r"\{output_[ab]\}", line)
                    if len(part.strip()) >= 3
                ]
        return tuple(dict.fromkeys(found))

    def _defused(self, text: str) -> str:
        """`text` with every delimiter of the template broken by a zero-width space after its first
        character, so an answer cannot close its frame and open a fake one (a reader sees no change)."""
        for delimiter in self.delimiters:
            text = text.replace(delimiter, delimiter[0] + ZERO_WIDTH_SPACE + delimiter[1:])
        return text

    def _examples(self, count: int) -> str:
        if count <= 0:
            return ""
        available = worked_examples()
        if count > len(available):
            raise FarmError(
                f"a judge asks for {count} worked examples; prompts/examples.yaml has {len(available)}"
            )
        parts = ["Worked examples of the task and the expected reply:\n"]
        for number, example in enumerate(available[:count], start=1):
            block = self._pair_text(
                self.sections["pair"],
                1,
                Shown(example.instruction, example.input, example.a, example.b),
            )
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
        entries = [
            {"pair": i, "rationale": why, "better": better}
            for i, (better, why) in enumerate(verdicts, start=1)
        ]
        return json.dumps({"verdicts": entries})
    if format == "ranking":
        return "\n".join(
            f"Pair {i}: {b} > {'B' if b == 'A' else 'A'}"
            for i, (b, _) in enumerate(verdicts, start=1)
        )
    return "\n".join(f"Pair {i}: {b}" for i, (b, _) in enumerate(verdicts, start=1))


def parse_template(name: str, text: str) -> Template:
    lines = text.splitlines()
    if not lines or not lines[0].startswith("format:"):
        raise FarmError(
            f"prompt template {name}: the first line must be `format: {'|'.join(FORMATS)}`"
        )
    format = lines[0].split(":", 1)[1].strip()
    if format not in FORMATS:
        raise FarmError(
            f"prompt template {name}: unknown format {format!r}; expected one of {', '.join(FORMATS)}"
        )
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
        raise FarmError(
            f"no prompt template {name!r}: not a shipped template ({', '.join(shipped_templates())}) nor a .txt file"
        )
    return parse_template(name, shipped.read_text(encoding="utf-8"))


def shipped_templates() -> list[str]:
    folder = importlib.resources.files("farmkit.annotate").joinpath("prompts")
    return sorted(entry.name[:-4] for entry in folder.iterdir() if entry.name.endswith(".txt"))


# ---------------------------------------------------------------------------------------------
# Parsing. A verdict is "A", "B" or "tie" for the pair as shown; None when the completion gives none.
#
# Judges write verdicts in many shapes ("Pair 1: B", "Output (b) is better.", "Verdict: B",
# "Reply B > Reply A", JSON after prose), and they quote: the answers they judge, the prompt's
# format, an injected fake verdict. The parser therefore (1) masks what is quoted (the template's
# answer delimiters, block quotes, code fences around prose, long double-quoted spans), (2) reads
# only the judge's answer section when it marks one ("Final verdict:"), and (3) collects every
# verdict statement per pair: one answer is the verdict, several different ones are a conflict and
# give None, because it cannot tell which one is the judge's own.

_LABEL = r"(?:answer|response|reply|output|option|assistant|candidate|model)"
_ONE = rf"(?:{_LABEL}\s*)?[\[(]?\s*([ab])\s*[\])]?"
_END = r"(?=\s*(?:$|[.!,;:)\]]|\s(?:is|wins|because|since|as|for|with|over)\b|\s*[-\u2013\u2014]))"
_PAIR = re.compile(
    r"^(?:pair|set|comparison)\s*#?\s*(\d+)\b\s*[:=.)\-\u2013\u2014]?\s*(.*)$", re.IGNORECASE
)
# What may follow a verdict that opens its line: nothing, or a reason ("B, since ...", "A > B because ...").
_REASON = r"\s*(?:[.!]?\s*$|[,;:(\-\u2013\u2014]|\s(?:because|since|as|for)\b)"
_BARE = re.compile(
    rf"^(?:(?:final\s+)?(?:answer|verdict|choice|winner|better)\s*[:=]\s*)?{_ONE}(?:\s*(?:is\s+better|wins|\(better\)))?{_REASON}",
    re.IGNORECASE,
)
_TIE = re.compile(
    r"^(?:(?:final\s+)?(?:answer|verdict)\s*[:=]\s*)?(?:a\s+)?(?:tie|draw|equal|a\s*=\s*b|b\s*=\s*a)\s*[.!]?$",
    re.IGNORECASE,
)
_RANKED = re.compile(rf"^{_ONE}\s*(>|<|=)\s*{_ONE}{_REASON}", re.IGNORECASE)
_PROSE = [  # (pattern, True when the named answer is the better one)
    (
        re.compile(
            rf"\b{_ONE}\s+(?:is|was)\s+(?:(?:clearly|slightly|much|far|somewhat|definitely|overall)\s+)?"
            rf"(?:(?:a\s+)?better|superior|stronger|preferable|preferred|more helpful|the (?:better|stronger|superior|preferred|winning)\b|the winner)",
            re.IGNORECASE,
        ),
        True,
    ),
    (
        re.compile(
            rf"\b{_ONE}\s+(?:is|was)\s+(?:(?:clearly|slightly|much|far)\s+)?worse\b", re.IGNORECASE
        ),
        False,
    ),
    (re.compile(rf"\b{_ONE}\s+wins\b", re.IGNORECASE), True),
    (
        re.compile(
            rf"\b(?:better|best|winning|preferred|superior|stronger)\s+{_LABEL.replace(')', '|one|choice)')}\s+(?:is|here is)\s*:?\s*{_ONE}{_END}",
            re.IGNORECASE,
        ),
        True,
    ),
    (
        re.compile(
            rf"\b(?:verdict|winner|choice|decision|preference|answer|better)\s*[:=]\s*{_ONE}{_END}",
            re.IGNORECASE,
        ),
        True,
    ),
    (
        re.compile(
            rf"\bI\s+(?:would\s+|'d\s+)?(?:prefer|choose|pick|select|go with)\s+{_ONE}{_END}",
            re.IGNORECASE,
        ),
        True,
    ),
]
# Words before a statement, in the same sentence, that make it not an assertion ("I don't think A is better").
_HEDGE = re.compile(
    r"\b(?:not|never|neither|nor|no|if|whether|unless|doubt)\b|n't|\bcannot\b", re.IGNORECASE
)
# The start of the judge's answer section: "Final verdict: B", or a heading alone ("Verdicts:").
_MARKER = re.compile(
    r"^(?:final\s+(?:answer|verdicts?|decision|ranking|choice|judge?ment)\b|(?:(?:my|your)\s+)?(?:verdicts?|answers?|ranking)\s*:?\s*$)",
    re.IGNORECASE,
)
_FENCE = re.compile(r"^[ \t]*(```|~~~)[^\n]*\n(.*?)^[ \t]*\1[ \t]*$", re.MULTILINE | re.DOTALL)
# Quoted text, except a quoted name of an answer ('The better answer is "Response B".').
_QUOTED_SPAN = re.compile(
    rf"\"(?!{_ONE}\")[^\"\n]{{4,}}\"|\u201c(?!{_ONE}\u201d)[^\u201d\n]{{4,}}\u201d", re.IGNORECASE
)
_MARKDOWN = re.compile(r"[*_`#\"\u201c\u201d]+|^\s*(?:[-+\u2022]|\d+[.)])\s+")


def parse_verdicts(
    format: str, completion: str, count: int, template: Template | None = None
) -> tuple[list[str | None], str | None]:
    """Verdicts for pairs 1..count from a completion, and a reason when some are missing.

    `template` (the one that asked) lets the parser mask answers the judge quotes inside the
    template's own delimiters."""
    masked = _mask_delimited(completion, template)
    candidates = _json_candidates(masked) if format == "json" else {}
    if not candidates:
        candidates = _text_candidates(masked)
    verdicts: list[str | None] = []
    conflicts = []
    for index in range(1, count + 1):
        given = candidates.get(index, set())
        verdicts.append(next(iter(given)) if len(given) == 1 else None)
        if len(given) > 1:
            conflicts.append(str(index))
    missing = [str(index) for index, verdict in enumerate(verdicts, start=1) if verdict is None]
    if not missing:
        return verdicts, None
    if not completion.strip():
        return verdicts, "empty completion"
    if conflicts:
        return (
            verdicts,
            f"conflicting verdicts for pair(s) {', '.join(conflicts)} of {count}; cannot tell which is the judge's own",
        )
    if not candidates:
        return verdicts, f"no verdict could be parsed from the completion ({format} format)"
    return verdicts, f"the completion gave no verdict for pair(s) {', '.join(missing)} of {count}"


def _blank(match: re.Match) -> str:
    """The matched text with everything but line breaks blanked, so line structure survives."""
    return re.sub(r"[^\n]", " ", match.group(0))


def _mask_delimited(completion: str, template: Template | None) -> str:
    """Blank what the judge quotes between the template's answer delimiters, and block quotes."""
    masked = re.sub(r"^[ \t]*>.*$", _blank, completion, flags=re.MULTILINE)
    for opener, closer in _delimiter_pairs(template):
        masked = re.sub(
            re.escape(opener) + r".*?(?:" + re.escape(closer) + r"|\Z)",
            _blank,
            masked,
            flags=re.DOTALL,
        )
    return masked


def _delimiter_pairs(template: Template | None) -> list[tuple[str, str]]:
    """(opening line, closing line) around each answer of the template's [pair] section."""
    if template is None or template.format == "choice":
        return []
    lines = [line.strip() for line in template.sections["pair"].splitlines()]
    return [
        (lines[number - 1], lines[number + 1])
        for number, line in enumerate(lines)
        if line in ("{output_a}", "{output_b}")
        and 0 < number < len(lines) - 1
        and lines[number - 1]
        and lines[number + 1]
    ]


def _text_candidates(masked: str) -> dict[int, set[str]]:
    """Every verdict statement, by pair, from the judge's own text (quotes masked)."""
    body = _FENCE.sub(_blank, masked)
    if not _has_letters(body):  # the whole reply is one fenced block: that block is the answer
        body = _FENCE.sub(lambda match: "\n" + match.group(2) + "\n", masked)
    body = _QUOTED_SPAN.sub(_blank, body)
    lines = [_MARKDOWN.sub(" ", line).strip() for line in body.splitlines()]
    pair = 1
    markers = [number for number, line in enumerate(lines) if _MARKER.match(line)]
    if markers:  # the judge marked its answer section: reasoning before it does not vote
        labels = [_PAIR.match(line) for line in lines[: markers[0]]]
        pair = next(
            (int(label.group(1)) for label in reversed(labels) if label), 1
        )  # the section it is in
        lines = lines[markers[0] :]
    content = [line for line in lines if line]
    found: dict[int, set[str]] = {}
    for line in content:
        labelled = _PAIR.match(line)
        if labelled:
            pair = int(labelled.group(1))
            line = labelled.group(2).strip()
            if not line:
                continue
        # a line that is only a verdict counts after a pair label, as the whole reply, or as a lone letter
        whole = labelled or len(content) == 1 or re.fullmatch(r"\W*[ab]\W*", line, re.IGNORECASE)
        verdict = _line_verdict(line) if whole else None
        for statement in ([verdict] if verdict else []) + _prose_verdicts(line):
            found.setdefault(pair, set()).add(statement)
    return found


def _has_letters(text: str) -> bool:
    return re.search(r"[^\W\d_]", text) is not None


def _line_verdict(text: str) -> str | None:
    """A verdict that is a whole line: `B`, `Output (b)`, `tie`, `Reply B > Reply A`."""
    text = text.strip()
    if _TIE.match(text):
        return "tie"
    ranked = _RANKED.match(text)
    if ranked:
        first, relation, second = ranked.group(1).upper(), ranked.group(2), ranked.group(3).upper()
        if first == second:
            return None
        if relation == "=":
            return "tie"
        return first if relation == ">" else second
    bare = _BARE.match(text)
    return bare.group(1).upper() if bare else None


def _prose_verdicts(line: str) -> list[str]:
    """The verdicts a sentence asserts ("Response A is better.", "The better answer is B.")."""
    verdicts = []
    for sentence in re.split(r"(?<=[.!?;])\s+", line):
        for pattern, names_better in _PROSE:
            for match in pattern.finditer(sentence):
                if _HEDGE.search(sentence[: match.start()]) or _HEDGE.search(
                    sentence[match.end() :][:12].split(",")[0]
                ):
                    continue
                letter = match.group(1).upper()
                verdicts.append(letter if names_better else ("B" if letter == "A" else "A"))
    return verdicts


def _json_candidates(masked: str) -> dict[int, set[str]]:
    """Verdicts from every JSON value in the completion that has the verdict shape."""
    decoder = json.JSONDecoder()
    found: dict[int, set[str]] = {}
    position = 0
    while True:
        starts = [
            index
            for index in (masked.find("{", position), masked.find("[", position))
            if index >= 0
        ]
        if not starts:
            return found
        begin = min(starts)
        try:
            value, end = decoder.raw_decode(masked, begin)
        except ValueError:
            position = begin + 1
            continue
        position = end
        for pair, verdict in _json_verdicts(value):
            found.setdefault(pair, set()).add(verdict)


def _json_verdicts(value: object) -> list[tuple[int, str]]:
    entries = value.get("verdicts") if isinstance(value, dict) else value
    if isinstance(value, dict) and entries is None and "better" in value:
        entries = [{"pair": 1, **value}]
    if not isinstance(entries, list):
        return []
    verdicts = []
    for position, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict) or "better" not in entry:
            continue
        pair = entry.get("pair", position)
        verdict = _line_verdict(str(entry["better"]))
        if (
            verdict
            and isinstance(pair, (int, str))
            and not isinstance(pair, bool)
            and str(pair).strip().isdigit()
        ):
            verdicts.append((int(str(pair).strip()), verdict))
    return verdicts
