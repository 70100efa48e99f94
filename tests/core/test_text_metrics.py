"""Exact match, token F1 and ROUGE-L against hand-computed values and a brute-force LCS."""

from __future__ import annotations

import itertools
import random

import pytest

from hyper_core.text_metrics import (
    TextScores,
    exact_match,
    lcs_length,
    normalize,
    rouge_l,
    token_f1,
    tokens,
)


def test_normalisation_drops_case_punctuation_and_extra_space() -> None:
    assert normalize("  Hello,   World!\n") == "hello world"
    assert normalize("ＡＢＣ") == "abc"  # NFKC: full-width letters
    assert tokens("我爱 Paris!") == ["我", "爱", "paris"]  # each CJK character a token


def test_hand_computed_scores() -> None:
    assert exact_match("The cat.", "the  cat") == 1.0
    assert exact_match("the cat", "a cat") == 0.0
    # 2 of 3 tokens in common each way: P = R = 2/3.
    assert token_f1("a b c", "a b d") == pytest.approx(2 / 3)
    # Multisets: "a a b" and "a b b" share one a and one b.
    assert token_f1("a a b", "a b b") == pytest.approx(2 / 3)
    # P = 1/1, R = 1/4: F1 = 2 * 0.25 / 1.25.
    assert token_f1("a", "a b c d") == pytest.approx(0.4)
    # LCS "a c d" of 4 and 4 tokens.
    assert rouge_l("a b c d", "a c d e") == pytest.approx(0.75)
    # Same tokens, order reversed: F1 is 1, ROUGE-L only the LCS of 1.
    assert token_f1("x y z", "z y x") == 1.0
    assert rouge_l("x y z", "z y x") == pytest.approx(1 / 3)
    assert token_f1("我爱北京", "我爱上海") == pytest.approx(0.5)
    assert token_f1("", "") == rouge_l("", "") == 1.0
    assert token_f1("", "a") == rouge_l("a", "") == 0.0


def _lcs_brute_force(a: list[str], b: list[str]) -> int:
    for k in range(min(len(a), len(b)), 0, -1):
        subsequences = set(itertools.combinations(b, k))
        if any(c in subsequences for c in itertools.combinations(a, k)):
            return k
    return 0


def test_lcs_equals_a_brute_force_search() -> None:
    rng = random.Random(0)
    for _ in range(200):
        a = [rng.choice("abc") for _ in range(rng.randint(0, 7))]
        b = [rng.choice("abc") for _ in range(rng.randint(0, 7))]
        assert lcs_length(a, b) == _lcs_brute_force(a, b), (a, b)


def test_corpus_scores_are_means() -> None:
    pairs = [("a b c", "a b d"), ("x", "x"), ("", "q")]
    scores = TextScores.of(pairs)
    assert scores.samples == 3
    assert scores.exact_match == pytest.approx(1 / 3)
    assert scores.token_f1 == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert scores.rouge_l == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert TextScores.of([]) == TextScores(0, 0.0, 0.0, 0.0)
