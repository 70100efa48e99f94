"""Text metrics of predictions against references: exact match, token F1 and ROUGE-L.

Both texts are normalised first: Unicode NFKC, lower case, punctuation removed, whitespace
collapsed. Tokens are the words between whitespace, except that each CJK character is a token
of its own (those scripts write no spaces). Per sample:

* exact match: 1.0 when the normalised texts are equal, else 0.0;
* token F1: the harmonic mean of precision and recall of the tokens in common, counted as
  multisets (SQuAD's F1); 1.0 when both are empty;
* ROUGE-L: the F-measure (β = 1) of the longest common subsequence of the tokens; 1.0 when
  both are empty.

The corpus score is the mean over the samples. No dependencies.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence

import attrs

_CJK = (
    "\u3040-\u30ff"  # hiragana, katakana
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # CJK ideographs
    "\uac00-\ud7af"  # hangul syllables
)
_TOKEN = re.compile(f"[{_CJK}]|[^\\s{_CJK}]+")


def normalize(text: str) -> str:
    """NFKC, lower case, punctuation (Unicode category P*) removed, whitespace collapsed."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(" " if unicodedata.category(c).startswith("P") else c for c in text)
    return " ".join(text.split())


def tokens(text: str) -> list[str]:
    """The normalised tokens of ``text`` (module docstring)."""
    return _TOKEN.findall(normalize(text))


def exact_match(prediction: str, reference: str) -> float:
    """1.0 when the normalised texts are equal."""
    return float(normalize(prediction) == normalize(reference))


def _f1(overlap: int, predicted: int, expected: int) -> float:
    if predicted == 0 and expected == 0:
        return 1.0
    if overlap == 0:
        return 0.0
    precision, recall = overlap / predicted, overlap / expected
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, reference: str) -> float:
    """F1 of the tokens in common (as multisets)."""
    p, r = tokens(prediction), tokens(reference)
    overlap = sum((Counter(p) & Counter(r)).values())
    return _f1(overlap, len(p), len(r))


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence (dynamic programming, O(len(a) len(b)))."""
    if len(a) < len(b):
        a, b = b, a
    row = [0] * (len(b) + 1)
    for x in a:
        diagonal = 0
        for j, y in enumerate(b, 1):
            up = row[j]
            row[j] = diagonal + 1 if x == y else max(row[j], row[j - 1])
            diagonal = up
    return row[-1]


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F-measure (β = 1) of the tokens."""
    p, r = tokens(prediction), tokens(reference)
    return _f1(lcs_length(p, r), len(p), len(r))


@attrs.frozen
class TextScores:
    """Corpus means of the per-sample metrics over ``samples`` pairs."""

    samples: int
    exact_match: float
    token_f1: float
    rouge_l: float

    @classmethod
    def of(cls, pairs: Iterable[tuple[str, str]]) -> TextScores:
        """The means over ``(prediction, reference)`` pairs (all 0.0 for none)."""
        em = f1 = rl = 0.0
        n = 0
        for prediction, reference in pairs:
            n += 1
            em += exact_match(prediction, reference)
            f1 += token_f1(prediction, reference)
            rl += rouge_l(prediction, reference)
        if n == 0:
            return cls(0, 0.0, 0.0, 0.0)
        return cls(n, em / n, f1 / n, rl / n)

    def to_json(self) -> dict[str, float | int]:
        """Plain numbers."""
        return attrs.asdict(self)

    def line(self) -> str:
        """``exact_match 0.250, token_f1 0.412, rouge_l 0.398 (20 samples)``."""
        return (
            f"exact_match {self.exact_match:.4f}, token_f1 {self.token_f1:.4f}, "
            f"rouge_l {self.rouge_l:.4f} ({self.samples} samples with a reference)"
        )
