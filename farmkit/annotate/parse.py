"""The verdict parser: reads the verdicts for pairs 1..count back out of a judge's completion.

A verdict is "A", "B" or "tie" for the pair as shown; None when the completion gives none.

Judges write verdicts in many shapes ("Pair 1: B", "Output (b) is better.", "Verdict: [[B]]",
"I prefer the second response.", "Reply B > Reply A", "B ≻ A", "1. B", markdown tables, JSON after
prose, JSON with other keys or single quotes), and they quote: the answers they judge, the
prompt's format, an injected fake verdict. The parser therefore (1) masks what is quoted (the
template's answer delimiters, block quotes, code fences around prose, long double-quoted spans),
(2) reads only the judge's answer section when it marks one ("Final verdict:"), and (3) collects
every verdict statement per pair: one answer is the verdict, several different ones are a conflict
and give None, because it cannot tell which one is the judge's own. Questions ("A is better? No")
and hedged sentences assert nothing.

Every parser is total: any string gives verdicts or None, in time about linear in its length
(whitespace runs are collapsed before any pattern runs, the JSON scan gives up after a bounded
number of false starts, nesting beyond the decoder's depth is a false start), and a reply longer
than MAX_REPLY_CHARS is not read at all.
"""

from __future__ import annotations

import json
import re

from farmkit.annotate.prompts import Template

# bump when a parser reads a completion differently: replies cached as unreadable by an older parser are
# re-read, and asked again where this one cannot read them either; cached verdicts are kept
PARSER_VERSION = 3
# the version in every cache key, as it was when a new parser made every verdict be asked again: fixed
# there, so that caches written before keep their keys
KEYED_VERSION = 3

# a judge's reply is a few thousand characters; anything far longer is junk, not read
MAX_REPLY_CHARS = 200_000
_JSON_FALSE_STARTS = 200  # brackets that do not open a readable value before the scan gives up
_LITERAL_SPAN = 8_000  # the longest single-quoted (Python-style) object tried
_TOO_DEEP = re.compile(r"(?:[\[{]\s?(?:\"[^\"\n]{0,40}\"\s?:\s?)?){32}")  # 32 levels opened at once
_LITERAL_START = re.compile(r"[\[{]\s?['\[{\]}]")

_LABEL = r"(?:answer|response|reply|output|option|assistant|candidate|model)"
# An answer named by its letter ("B", "Answer B", "(b)", "[Reply A]", "[[B]]") or by its place
# ("the second response", "the first one"): group 1 is the letter, group 2 the ordinal.
_ONE = (
    rf"(?:[\[(]{{0,2}}\s?(?:{_LABEL}\s?)?[\[(]{{0,2}}\s?([ab])\s?[\])]{{0,2}}"
    rf"|(?:the\s)?(first|second)\s(?:{_LABEL}|one)\b)"
)
_END = r"(?=\s?(?:$|[.!,;:)\]]|\s(?:is|wins|because|since|as|for|with|over)\b|\s?[-\u2013\u2014]))"
_SEPARATOR = r"(?:=>|->|[:=.)\-\u2013\u2014\u2192])"
_PAIR = re.compile(
    rf"^(?:pair|set|comparison)\s?#?\s?(\d+)\b\s?{_SEPARATOR}?\s?(.*)$", re.IGNORECASE
)
# Where a line that gives several pairs' verdicts ("Pair 1: A, Pair 2: B") is cut into one per pair.
_PAIR_CUT = re.compile(
    rf"(?<=[\s,;|/])(?=(?:pair|set|comparison)\s?#?\s?\d+\s?{_SEPARATOR})", re.IGNORECASE
)
# What may follow a verdict that opens its line: nothing, a reason ("B, since ...", "A > B because
# ..."), or the next sentence ("B. Answer A misses the point.").
_REASON = r"\s?(?:[.!]?\s?$|[.!]\s|[,;:(\-\u2013\u2014]|\s(?:because|since|as|for)\b)"
# A label before a verdict that is a whole line: "Verdict: B", "Final ranking: B > A", "My choice is A".
_PREFIX = re.compile(
    rf"^(?:(?:my|the|our)\s)?(?:final\s|overall\s)?(?:answer|verdict|choice|winner|ranking|decision|"
    rf"judge?ment|preferred|preference|better(?:\s{_LABEL})?)s?\s?(?:is\s?)?[:=]?\s?",
    re.IGNORECASE,
)
_BARE = re.compile(
    rf"^(?:(?:clearly|definitely|overall)\s)?{_ONE}(?:\s?(?:is\s(?:the\s)?better|wins|\(better\)))?{_REASON}",
    re.IGNORECASE,
)
_TIE = re.compile(
    r"^(?:a\s)?(?:tie|draw|equal|a\s?=\s?b|b\s?=\s?a)\s?[.!]?$",
    re.IGNORECASE,
)
_RANKED = re.compile(rf"^{_ONE}\s?(>|<|=)\s?{_ONE}{_REASON}", re.IGNORECASE)
_DOUBLE_BRACKETS = re.compile(r"\[\[\s?([ab])\s?\]\]", re.IGNORECASE)
_PROSE = [  # (pattern, True when the named answer is the better one)
    (
        re.compile(
            rf"\b{_ONE}\s(?:is|was)\s(?:(?:clearly|slightly|much|far|somewhat|definitely|overall)\s)?"
            rf"(?:(?:a\s)?better|superior|stronger|preferable|preferred|more helpful|the (?:better|stronger|superior|preferred|winning)\b|the winner)",
            re.IGNORECASE,
        ),
        True,
    ),
    (
        re.compile(
            rf"\b{_ONE}\s(?:is|was)\s(?:(?:clearly|slightly|much|far)\s)?worse\b", re.IGNORECASE
        ),
        False,
    ),
    (re.compile(rf"\b{_ONE}\swins\b", re.IGNORECASE), True),
    (
        re.compile(
            rf"\b(?:better|best|winning|preferred|superior|stronger)\s{_LABEL.replace(')', '|one|choice)')}\s(?:is|here is)\s?:?\s?{_ONE}{_END}",
            re.IGNORECASE,
        ),
        True,
    ),
    (
        re.compile(
            rf"\b(?:overall|verdict|winner|choice|decision|preference|preferred|answer|better(?:\s{_LABEL})?)\s?(?:[:=]|\sis\b)\s?{_ONE}{_END}",
            re.IGNORECASE,
        ),
        True,
    ),
    (  # a judge that takes its verdict back ("A, no wait, B") names both: no verdict
        re.compile(
            rf"\b(?:no wait|wait|actually|or rather|rather|I mean|correction)\s?[,:]?\s?{_ONE}{_END}",
            re.IGNORECASE,
        ),
        True,
    ),
    (
        re.compile(
            rf"\bI\s?(?:would\s|will\s|['\u2019]d\s|['\u2019]ll\s)?(?:prefer|choose|pick|select|go with)\s{_ONE}{_END}",
            re.IGNORECASE,
        ),
        True,
    ),
]
# Words before a statement, in the same sentence, that make it not an assertion ("I don't think A is better").
_HEDGE = re.compile(
    r"\b(?:not|never|neither|nor|no|if|whether|unless|doubt)\b|n['\u2019]t|\bcannot\b",
    re.IGNORECASE,
)
# Words right after a statement that make it a claim about one aspect ("A is better on tone"), not a verdict.
_ASPECT = re.compile(
    r"\s?(?:on|in (?:terms|places|parts|some|certain)|regarding|stylistically|written|formatted|structured)\b",
    re.IGNORECASE,
)
_HEDGE_REACH = 80  # characters before a statement searched for a hedge
# The start of the judge's answer section: "Final verdict: B", or a heading alone ("Verdicts:").
_MARKER = re.compile(
    r"^(?:final\s(?:answer|verdicts?|decision|ranking|choice|judge?ment)\b|(?:(?:my|your)\s)?(?:verdicts?|answers?|ranking)\s?:?\s?$)",
    re.IGNORECASE,
)
_FENCE_LINE = re.compile(r"^[ \t]*(```|~~~)")
# Quoted text, except a quoted name of an answer ('The better answer is "Response B".').
_QUOTED_SPAN = re.compile(
    rf"\"(?!{_ONE}\")[^\"\n]{{4,}}\"|\u201c(?!{_ONE}\u201d)[^\u201c\u201d\n]{{4,}}\u201d",
    re.IGNORECASE,
)
_EMPHASIS = re.compile(r"[*_`#\"\u201c\u201d]+")
_RULE = re.compile(r"^\s?[-=~]{2,}|[-=~]{2,}\s?$")  # `--- Set 1 ---`, `== Comparison 2 ==`
_TABLE_KEY = re.compile(r"(?:pairs?|sets?|comparisons?|no\.?|n|number|index|id|)", re.IGNORECASE)
_CRITERIA = re.compile(r"criteri|aspect|dimension|categor|factor|metric|score", re.IGNORECASE)
_LIST_ITEM = re.compile(r"^(?:[-+\u2022]\s|(\d+)[.)]\s)")
_RELATIONS = [  # spellings of a ranking's relation, as `>` or `<`
    (re.compile(r"\s?(?:>>|\u227b|\u226b|\u00bb|\u203a)\s?"), " > "),
    (re.compile(r"\s?(?:<<|\u227a|\u226a|\u00ab|\u2039)\s?"), " < "),
]
_JSON_PAIR_KEYS = ("pair", "index", "id", "pair_id", "pair_index", "comparison", "set")
_JSON_VERDICT_KEYS = ("better", "winner", "preferred", "choice", "verdict", "preference")
_JSON_LISTS = ("verdicts", "results", "judgments", "judgements", "comparisons", "pairs")
_JSON_NUMBER = re.compile(
    r"^\s*(?:(?:pair|set|comparison)\s?[_#\-]?\s?)?(\d{1,6})\s*$", re.IGNORECASE
)


def parse_verdicts(
    format: str, completion: str, count: int, template: Template | None = None
) -> tuple[list[str | None], str | None]:
    """Verdicts for pairs 1..count from a completion, and a reason when some are missing.

    `template` (the one that asked) lets the parser mask answers the judge quotes inside the
    template's own delimiters. Never raises: a reply it cannot read gives None with the reason."""
    if not isinstance(completion, str):
        return [None] * count, f"the completion is not text ({type(completion).__name__})"
    if len(completion) > MAX_REPLY_CHARS:
        return [None] * count, (
            f"the completion has {len(completion)} characters; a judge's reply is read up to "
            f"{MAX_REPLY_CHARS}"
        )
    try:
        return _parse(format, completion, count, template)
    except (RecursionError, MemoryError, ValueError) as error:  # last guard: never crash a run
        return [None] * count, f"the completion could not be read ({type(error).__name__})"


def _parse(
    format: str, completion: str, count: int, template: Template | None
) -> tuple[list[str | None], str | None]:
    text = _normalized(completion)
    masked = _mask_delimited(text, template)
    candidates = _json_candidates(masked, count) if format == "json" else None
    if candidates is None:
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


def _normalized(completion: str) -> str:
    """One line break per line, runs of other whitespace as one space: no pattern below can then
    backtrack over a long run of spaces."""
    return re.sub(r"[^\S\n]+", " ", "\n".join(completion.splitlines()))


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


def _fenced(lines: list[str]) -> list[tuple[int, int]]:
    """(first, last) line of each closed code fence, in one pass: an opener is closed by the next
    bare fence line of its kind; an opener never closed is not a fence."""
    kinds = [_FENCE_LINE.match(line) for line in lines]
    following: dict[str, int] = {}
    next_closer: list[dict[str, int]] = [{}] * (len(lines) + 1)
    for number in range(len(lines) - 1, -1, -1):
        next_closer[number + 1] = dict(following) if kinds[number] else next_closer[number + 1]
        kind = kinds[number]
        if kind and lines[number].strip() == kind.group(1):
            following[kind.group(1)] = number
        next_closer[number] = following if kind else next_closer[number + 1]
    spans, number = [], 0
    while number < len(lines):
        kind = kinds[number]
        closer = next_closer[number + 1].get(kind.group(1)) if kind else None
        if closer is not None and closer > number:
            spans.append((number, closer))
            number = closer + 1
        else:
            number += 1
    return spans


def _strip_fences(text: str) -> str:
    """The text with fenced blocks blanked, or, when the whole reply is one fenced block (its letters
    are all inside fences), with only the fence lines blanked: that block is the answer."""
    lines = text.split("\n")
    spans = _fenced(lines)
    if not spans:
        return text
    outside = list(lines)
    inside = list(lines)
    for first, last in spans:
        for number in range(first, last + 1):
            outside[number] = ""
        inside[first] = inside[last] = ""
    if _has_letters("\n".join(outside)):
        return "\n".join(outside)
    return "\n".join(inside)


def _table_cells(line: str) -> list[str] | None:
    if not (line.startswith("|") and line.endswith("|") and len(line) > 2):
        return None
    return [cell.strip() for cell in line[1:-1].split("|")]


def _table_row(cells: list[str]) -> str | None:
    """A row `| 1 | B |` or `| Pair 2 | Answer A | reason |` as `Pair N: X`; None for other rows."""
    number = _JSON_NUMBER.match(cells[0]) if cells else None
    if not number:
        return None
    found = {v for v in (_line_verdict(cell) for cell in cells[1:] if cell) if v}
    if len(found) != 1:
        return None if not found else f"Pair {number.group(1)}: A\nPair {number.group(1)}: B"
    return f"Pair {number.group(1)}: {found.pop()}"


def _lines(masked: str) -> list[str]:
    """The judge's own lines, markup removed; a table row or numbered item of verdicts as `Pair N: X`,
    a line of several pairs' verdicts cut into one per pair."""
    body = _QUOTED_SPAN.sub(_blank, _strip_fences(masked))
    out: list[str] = []
    table: bool | None = None  # in a table: whether its first column numbers pairs
    for raw in body.split("\n"):
        line = _RULE.sub(" ", _EMPHASIS.sub(" ", raw)).strip()
        for pattern, relation in _RELATIONS:
            line = pattern.sub(relation, line)
        line = re.sub(r"\s+", " ", line)
        cells = _table_cells(line)
        if cells is None:
            table = None
        elif table is None and not _JSON_NUMBER.match(cells[0]):  # a table's header row
            # `| Pair | Better |`, `| # | Winner |`; not `| # | Criterion | Winner |`
            table = bool(_TABLE_KEY.fullmatch(cells[0])) and not _CRITERIA.search(line)
            continue
        else:
            table = True if table is None else table  # a table without a header row
            row = _table_row(cells) if table else None  # criteria by number are not pairs
            if row is not None:
                out += row.split("\n")
                continue
        item = _LIST_ITEM.match(line)
        numbered = None
        if item:
            line = line[item.end() :].strip()
            if item.group(1) and _line_verdict(line):  # `1. B`, `2. A > B`: a numbered verdict
                numbered = f"Pair {item.group(1)}: {line}"
        if numbered:
            out.append(numbered)
            continue
        # several pairs' verdicts on one line are cut apart, but only on a line of verdicts (one that
        # opens with a pair label): a sentence that quotes `Pair 1: B` must not vote
        prefix = _PREFIX.match(line)
        rest = line[prefix.end() :] if prefix else line
        if _PAIR.match(rest):
            out += [part.strip(" ,;|/") for part in _PAIR_CUT.split(line)]
        else:
            out.append(line)
    return out


def _text_candidates(masked: str) -> dict[int, set[str]]:
    """Every verdict statement, by pair, from the judge's own text (quotes masked)."""
    lines = _lines(masked)
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
    after_label = False
    for line in content:
        labelled = _PAIR.match(line)
        if labelled:
            pair = int(labelled.group(1))
            line = labelled.group(2).strip()
            if not line or not _has_letters(line):
                after_label = True  # `Set 1:` alone: its verdict is the next line
                continue
        # a line that is only a verdict counts after a pair label, as the whole reply, or as a lone letter
        whole = (
            labelled
            or after_label
            or len(content) == 1
            or re.fullmatch(r"\W*[ab]\W*", line, re.IGNORECASE)
        )
        after_label = False
        verdict = _line_verdict(line) if whole else None
        statements = ([verdict] if verdict else []) + _prose_verdicts(line)
        for statement in statements:
            found.setdefault(pair, set()).add(statement)
    return found


def _has_letters(text: str) -> bool:
    return re.search(r"[^\W\d_]", text) is not None


def _who(match: re.Match, group: int) -> str:
    """A or B from _ONE's groups starting at `group` (the letter, or the ordinal)."""
    letter = match.group(group)
    if letter:
        return letter.upper()
    return "A" if match.group(group + 1).lower() == "first" else "B"


def _line_verdict(text: str) -> str | None:
    """A verdict that is a whole line: `B`, `Output (b)`, `[[A]]`, `tie`, `Reply B > Reply A`."""
    text = " ".join(text.split())  # JSON values reach here without the reply's normalizing
    prefix = _PREFIX.match(text)
    if prefix and prefix.end() < len(text):
        text = text[prefix.end() :]
    if _TIE.match(text):
        return "tie"
    ranked = _RANKED.match(text)
    if ranked:
        first, relation, second = _who(ranked, 1), ranked.group(3), _who(ranked, 4)
        if first == second:
            return None
        if relation == "=":
            return "tie"
        return first if relation == ">" else second
    bare = _BARE.match(text)
    return _who(bare, 1) if bare else None


def _prose_verdicts(line: str) -> list[str]:
    """The verdicts a sentence asserts ("Response A is better.", "The better answer is B.",
    "[[B]]"); a question or a hedged sentence asserts none."""
    verdicts = []
    for sentence in re.split(r"(?<=[.!?;])\s", line):
        if sentence.rstrip().endswith("?"):
            continue
        matches = [(match, True, 1) for match in _DOUBLE_BRACKETS.finditer(sentence)]
        for pattern, names_better in _PROSE:
            matches += [(match, names_better, 0) for match in pattern.finditer(sentence)]
        for match, names_better, kind in matches:
            before = sentence[max(0, match.start() - _HEDGE_REACH) : match.start()]
            after = sentence[match.end() : match.end() + 12].split(",")[0]
            if _HEDGE.search(before) or _HEDGE.search(after) or _ASPECT.match(after):
                continue
            letter = match.group(1).upper() if kind else _who(match, 1)
            verdicts.append(letter if names_better else ("B" if letter == "A" else "A"))
    return verdicts


def _json_candidates(masked: str, count: int) -> dict[int, set[str]] | None:
    """Verdicts from every JSON (or Python-literal) value in the completion with a verdict shape;
    None when it holds no such value (the reply is then read as text). Gives up, reading nothing,
    after _JSON_FALSE_STARTS brackets that open no value: past that the text is not a judge's
    reply, and reading part of it could miss a conflicting verdict."""
    decoder = json.JSONDecoder()
    found: dict[int, set[str]] = {}
    shaped = False
    false_starts = 0
    position = 0
    closers: dict[int, int] | None = None  # computed at the first false start
    for opener in re.finditer(r"[\[{]", masked):
        begin = opener.start()
        if begin < position:  # inside a value already read
            continue
        if _TOO_DEEP.match(masked, begin):  # nesting no judge writes: the decoder must not recurse
            value, end = None, -1
        else:
            try:
                value, end = decoder.raw_decode(masked, begin)
            except (ValueError, RecursionError):
                closers = _closers(masked) if closers is None else closers
                value, end = _literal(masked, begin, closers.get(begin, -1))
        if end < 0:
            false_starts += 1
            if false_starts > _JSON_FALSE_STARTS:
                return {}
            continue
        position = end
        verdicts = _json_verdicts(value, count)
        if verdicts is not None:
            shaped = True
            for pair, verdict in verdicts:
                found.setdefault(pair, set()).add(verdict)
    return found if shaped else None


def _closers(text: str) -> dict[int, int]:
    """Where the bracket opened at each index closes (by count, ignoring quotes), in one pass."""
    stack: list[int] = []
    closers: dict[int, int] = {}
    for match in re.finditer(r"[\[\]{}]", text):
        if match.group() in "[{":
            stack.append(match.start())
        elif stack:
            closers[stack.pop()] = match.start()
    return closers


def _literal(text: str, begin: int, close: int) -> tuple[object, int]:
    """A Python-literal object or list with single quotes (`{'better': 'B'}`) from `begin` to the
    bracket `close`, and its end; (None, -1) when there is none."""
    import ast
    import warnings

    if close < 0 or close - begin > _LITERAL_SPAN or not _LITERAL_START.match(text, begin):
        return None, -1
    span = text[begin : close + 1]
    if "'" not in span:
        return None, -1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # junk can hold escapes Python warns about
            return ast.literal_eval(span), close + 1
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None, -1


def _json_number(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        number = _JSON_NUMBER.match(value)
        return int(number.group(1)) if number else None
    return None


def _json_verdict(entry: object) -> set[str] | None:
    """The verdict(s) an entry gives: a string (`"B"`, `"Response B"`), or the verdict keys of an
    object; None when it gives none."""
    if isinstance(entry, str):
        verdict = _line_verdict(entry) if len(entry) < 200 else None
        return {verdict} if verdict else None
    if isinstance(entry, dict):
        given = {
            verdict
            for key in _JSON_VERDICT_KEYS
            if isinstance(entry.get(key), str)
            for verdict in (_json_verdict(entry[key]) or {"?"})
        }
        return given or None
    return None


def _json_verdicts(value: object, count: int) -> list[tuple[int, str]] | None:
    """(pair, verdict) from one JSON value; None when it has no verdict shape. Pairs numbered from
    0 are read as such when their numbers are exactly 0..count-1; numbers that fit neither way, or
    that are not numbers, give nothing for the whole value: never a shifted verdict."""
    entries: object = value
    if isinstance(value, dict):
        listed = next((value[key] for key in _JSON_LISTS if key in value), None)
        if listed is not None:
            entries = listed
        elif any(key in value for key in _JSON_VERDICT_KEYS):
            entries = [value]
    numbered: list[tuple[int | None, set[str]]] = []  # (number, verdicts); None: not a number
    if isinstance(entries, list):
        for position, entry in enumerate(entries, start=1):
            given = _json_verdict(entry)
            if given is None:
                continue
            keys = [key for key in _JSON_PAIR_KEYS if isinstance(entry, dict) and key in entry]
            numbered.append((_json_number(entry[keys[0]]) if keys else position, given))
    elif isinstance(entries, dict):  # {"1": "B", "2": "A"} or {"pair_1": "A"}
        for key, entry in entries.items():
            given = _json_verdict(entry)
            if given is not None and _json_number(key) is not None:
                numbered.append((_json_number(key), given))
    if not numbered:
        return (
            None
            if not isinstance(value, dict) or not set(value) & {*_JSON_LISTS, *_JSON_VERDICT_KEYS}
            else []
        )
    numbers = {number for number, _ in numbered}
    if None in numbers:
        return []
    if 0 in numbers:
        if numbers != set(range(count)):
            return []
        numbered = [(number + 1, given) for number, given in numbered]  # type: ignore[operator]
    # "?" (a verdict key whose value names no answer) only counts beside another one: a conflict
    return [
        (number, verdict)
        for number, given in numbered
        for verdict in given
        if number is not None and 1 <= number <= count and given != {"?"}
    ]
