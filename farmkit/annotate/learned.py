"""Learned judges: a reward r(x, y) fitted as Bradley-Terry on real preference pairs, cheap enough to
train on tens of thousands of pairs and to score thousands of answers a second on one CPU.

Definitions. An answer y to an instruction x has features f(x, y): hashed word 1- and 2-grams of the
answer (log counts, scaled to unit length so they say what is written, not how much) and a few
hand-made features (length, structure, relevance to the instruction, repetition, a clean ending;
standardized on the training answers). The reward is linear, r(x, y) = w . f(x, y), and the model
says P(A preferred to B) = sigmoid(r(x, A) - r(x, B)). w minimizes the mean cross-entropy against
the (possibly soft) labels plus l2 / 2 * |w|^2. There is no intercept: the order shown cannot matter.

A judge folder holds meta.json (kind "learned_judge") and weights.npz (the hashed weights, stored as
float16, and the hand features' weights, means and scales).
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from farmkit.core.fields import help_field
from farmkit.core.values import NON_NEGATIVE, Bounds, check_number

KIND = "learned_judge"
WEIGHTS_FILE = "weights.npz"
_TOKEN = re.compile(r"[a-z0-9']+|[^\sa-z0-9']")
_LIST_LINE = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+")
_REFUSAL = re.compile(
    r"\b(?:as an ai|i'm sorry|i am sorry|i cannot|i can't|i apologi[sz]e|language model)\b"
)

HAND_FEATURES = (
    "log_words",
    "log_chars",
    "log_lines",
    "list_share",
    "headers",
    "code_fence",
    "bold",
    "clean_ending",
    "relevance",
    "variety",
    "mean_sentence_words",
    "refusal",
    "digits_share",
)
FEATURE_SETS = ("ngrams+hand", "hand", "length")


@dataclass(frozen=True)
class JudgeConfig:
    """How a learned judge is built and fitted."""

    buckets: int = help_field(
        2**18,
        "Hashed n-gram features (a power of two); weights.npz holds two bytes per bucket.",
        bounds=Bounds(min=2),
    )
    ngrams: int = 2  # word n-grams up to this length
    l2: float = help_field(3e-6, "Ridge penalty.", bounds=NON_NEGATIVE)  # per pair
    max_iterations: int = 300  # L-BFGS iterations
    features: str = help_field(
        "ngrams+hand",
        "Hashed word 1-2-grams plus hand features, the hand features alone, or length alone (a baseline).",
        FEATURE_SETS,
    )

    def __post_init__(self) -> None:
        if self.buckets < 2 or self.buckets & (self.buckets - 1):
            raise ValueError("buckets must be a power of two")
        if self.ngrams < 1:
            raise ValueError("ngrams must be at least 1")
        try:
            check_number(self.l2, float, NON_NEGATIVE)
        except ValueError as exc:
            raise ValueError(f"l2: {exc}") from None
        if self.features not in FEATURE_SETS:
            raise ValueError(f"features must be one of {', '.join(FEATURE_SETS)}")

    def hand_mask(self) -> np.ndarray:
        """1 for the hand features this judge uses, 0 for the others."""
        if self.features == "length":
            return np.array([name == "log_words" for name in HAND_FEATURES], dtype=np.float64)
        return np.ones(len(HAND_FEATURES))


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


_DIGIT = re.compile(r"\d")
# words as the heuristic gold (oracle.py) and the hand features count them
_WORD = re.compile(r"[a-z0-9']+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


_SENTENCE_END = re.compile(r"[.!?](?:\s|$)")
_ENDINGS = (".", "!", "?", ")", '"', "'", "`", "*", ":")


def hand_features(instruction: str, input: str, output: str) -> list[float]:
    """The raw hand features of an answer, in the order of HAND_FEATURES."""
    lowered = output.lower()
    tokens = words(lowered)
    lines = [line for line in output.splitlines() if line.strip()]
    content = {w for w in words(f"{instruction} {input}") if len(w) >= 4}
    relevance = len(content.intersection(tokens)) / len(content) if content else 1.0
    trigrams = len(tokens) - 2
    variety = (
        len(set(zip(tokens, tokens[1:], tokens[2:], strict=False))) / trigrams
        if trigrams > 0
        else 1.0
    )
    sentences = max(1, len(_SENTENCE_END.findall(output)))
    return [
        math.log1p(len(tokens)),
        math.log1p(len(output)),
        math.log1p(len(lines)),
        sum(1 for line in lines if _LIST_LINE.match(line)) / len(lines) if lines else 0.0,
        float(sum(1 for line in lines if line.lstrip().startswith("#"))),
        float("```" in output),
        float("**" in output),
        float(output.rstrip().endswith(_ENDINGS)),
        relevance,
        variety,
        len(tokens) / sentences,
        float(bool(_REFUSAL.search(lowered))),
        len(_DIGIT.findall(output)) / max(1, len(output)),
    ]


_TOKEN_HASHES: dict[str, int] = {}
_MIX = np.uint64(0x100000001B3)  # FNV-1a's 64-bit prime, to combine the hashes of n tokens


def _token_hashes(tokens: list[str]) -> np.ndarray:
    """A stable 32-bit hash (crc32) of each token, memoized: the same token recurs across answers."""
    if len(_TOKEN_HASHES) > 2_000_000:
        _TOKEN_HASHES.clear()
    hashes = []
    for token in tokens:
        value = _TOKEN_HASHES.get(token)
        if value is None:
            value = _TOKEN_HASHES[token] = zlib.crc32(token.encode())
        hashes.append(value)
    return np.array(hashes, dtype=np.uint64)


def _hashed_rows(outputs: Sequence[str], config: JudgeConfig) -> Any:
    """A sparse matrix (answers x buckets) of unit-length log n-gram counts. An n-gram's bucket is
    its tokens' crc32 hashes combined by multiply-xor (FNV-1a's prime) and masked."""
    from scipy import sparse

    indptr, indices, values = [0], [], []
    mask = np.uint64(config.buckets - 1)
    for text in outputs:
        token_hash = _token_hashes(_tokens(text))
        keys = []
        combined = token_hash
        for n in range(1, config.ngrams + 1):
            if n > 1:
                combined = (combined[:-1] * _MIX) ^ token_hash[n - 1 :]
            keys.append((combined ^ np.uint64(n)) & mask)
        if len(token_hash):
            column, count = np.unique(np.concatenate(keys), return_counts=True)
            value = np.log1p(count.astype(np.float64))
            value /= np.linalg.norm(value)
            indices.append(column.astype(np.int64))
            values.append(value)
            indptr.append(indptr[-1] + len(column))
        else:
            indptr.append(indptr[-1])
    return sparse.csr_matrix(
        (
            np.concatenate(values) if values else np.zeros(0),
            np.concatenate(indices) if indices else np.zeros(0, dtype=np.int64),
            np.asarray(indptr),
        ),
        shape=(len(outputs), config.buckets),
    )


@dataclass
class LearnedJudge:
    """A fitted judge: weights over hashed n-grams and standardized hand features."""

    config: JudgeConfig
    hashed: np.ndarray  # (buckets,)
    hand: np.ndarray  # (len(HAND_FEATURES),)
    mean: np.ndarray
    scale: np.ndarray

    def score(self, texts: Sequence[tuple[str, str, str]]) -> list[float]:
        """Rewards of (instruction, input, output) triples."""
        if not texts:
            return []
        grams = _hashed_rows([t[2] for t in texts], self.config)
        raw = np.array([hand_features(*t) for t in texts], dtype=np.float64)
        rewards = grams @ self.hashed + ((raw - self.mean) / self.scale) @ self.hand
        return [float(r) for r in rewards]

    def margins(self, features: Features, rows: Any) -> np.ndarray:
        """r(output_2) - r(output_1) of the pairs `rows` of precomputed features."""
        first, second = features.first[rows], features.second[rows]
        hand = (features.raw[second] - features.raw[first]) / self.scale
        return (features.grams[second] - features.grams[first]) @ self.hashed + hand @ self.hand

    def save(self, folder: Path) -> None:
        np.savez_compressed(
            folder / WEIGHTS_FILE,
            hashed=self.hashed.astype(np.float16),
            hand=self.hand,
            mean=self.mean,
            scale=self.scale,
        )

    @classmethod
    def load(cls, folder: str | Path, meta: dict[str, Any]) -> LearnedJudge:
        with np.load(Path(folder) / WEIGHTS_FILE) as weights:
            return cls(
                JudgeConfig(**meta["config"]),
                weights["hashed"].astype(np.float64),
                weights["hand"],
                weights["mean"],
                weights["scale"],
            )


@dataclass(frozen=True)
class Pair:
    """One training pair: the instruction, both answers, the target P(output_2 preferred) in [0, 1],
    and the system being judged (for holding systems out)."""

    instruction: str
    input: str
    output_1: str
    output_2: str
    target: float
    system: str = ""


class Features:
    """The features of every distinct answer in a set of pairs, computed once (k-fold validation
    fits several judges on subsets of the same pairs)."""

    def __init__(self, pairs: Sequence[Pair], config: JudgeConfig) -> None:
        from scipy import sparse

        unique = list(
            dict.fromkeys(
                t
                for p in pairs
                for t in (
                    (p.instruction, p.input, p.output_1),
                    (p.instruction, p.input, p.output_2),
                )
            )
        )
        row = {t: i for i, t in enumerate(unique)}
        self.first = np.array([row[(p.instruction, p.input, p.output_1)] for p in pairs])
        self.second = np.array([row[(p.instruction, p.input, p.output_2)] for p in pairs])
        self.target = np.array([p.target for p in pairs], dtype=np.float64)
        self.raw = np.array([hand_features(*t) for t in unique], dtype=np.float64)
        if config.features == "ngrams+hand":
            self.grams = _hashed_rows([t[2] for t in unique], config)
        else:
            self.grams = sparse.csr_matrix((len(unique), config.buckets))
        self.config = config


def fit(pairs: Sequence[Pair] | Features, config: JudgeConfig, subset: Any = None) -> LearnedJudge:
    """Fit the Bradley-Terry weights on `pairs` (or on the rows `subset` of precomputed features) by
    L-BFGS on the convex penalized cross-entropy."""
    from scipy import optimize, sparse

    features = pairs if isinstance(pairs, Features) else Features(pairs, config)
    rows = np.arange(len(features.target)) if subset is None else np.asarray(subset)
    first, second = features.first[rows], features.second[rows]
    used = np.unique(np.concatenate([first, second]))
    mean = features.raw[used].mean(axis=0)
    scale = features.raw[used].std(axis=0)
    scale[scale == 0] = 1.0
    hand = (features.raw[second] - features.raw[first]) / scale * config.hand_mask()
    difference = sparse.hstack(
        [features.grams[second] - features.grams[first], sparse.csr_matrix(hand)]
    ).tocsr()
    target = features.target[rows]
    count = len(rows)
    penalty = config.l2

    def loss(weights: np.ndarray) -> tuple[float, np.ndarray]:
        margin = difference @ weights
        # cross-entropy of sigmoid(margin) against the soft target, computed stably
        value = np.mean(np.logaddexp(0.0, margin) - target * margin)
        residual = (1.0 / (1.0 + np.exp(-margin)) - target) / count
        gradient = difference.T @ residual + penalty * weights
        return value + 0.5 * penalty * float(weights @ weights), gradient

    result = optimize.minimize(
        loss,
        np.zeros(difference.shape[1]),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": config.max_iterations},
    )
    weights = result.x
    return LearnedJudge(config, weights[: config.buckets], weights[config.buckets :], mean, scale)


def config_dict(config: JudgeConfig) -> dict[str, Any]:
    return asdict(config)


def shipped_judges() -> Path:
    """The folder of the judges that ship with farmkit (farmkit/annotate/judges/NAME/)."""
    import importlib.resources

    return Path(str(importlib.resources.files("farmkit.annotate").joinpath("judges")))


def judge_folder(name_or_folder: str) -> Path:
    """A judge folder: a path, or the name of a judge shipped with farmkit."""
    shipped = shipped_judges() / name_or_folder
    if "/" not in name_or_folder and (shipped / "meta.json").is_file():
        return shipped
    return Path(name_or_folder)


def load_judge(name_or_folder: str) -> LearnedJudge | None:
    """The learned judge in a folder (or shipped under that name); None when the folder holds
    another kind of model (a reward model)."""
    import json

    from farmkit.core.io import FarmError

    folder = judge_folder(name_or_folder)
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        return None  # a reward model folder or hub id, which RewardScorer reads
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise FarmError(f"{meta_path}: not valid JSON ({error})") from None
    if meta.get("kind") != KIND:
        return None
    try:
        return LearnedJudge.load(folder, meta)
    except (OSError, KeyError, TypeError, ValueError) as error:
        raise FarmError(f"{folder}: a damaged learned judge ({error})") from None


def judge_names() -> list[str]:
    root = shipped_judges()
    return (
        sorted(p.name for p in root.iterdir() if (p / "meta.json").is_file())
        if root.is_dir()
        else []
    )
