"""Answer scoring (SQuAD rules, as Search-R1 and FlashRAG use): ``normalize_answer``,
``exact_match``, ``f1_score`` and ``answer_in_text``. The rollout's reward functions built on them
are ``train.reward_funcs``."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower, remove punctuation, remove articles, fix whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str | None, golden_answers: Sequence[str] | str) -> float:
    """1.0 if the normalised prediction equals a normalised gold answer, else 0.0.

    ``None`` or an empty prediction scores 0.0 (an empty string never matches, even an
    empty gold answer).
    """
    if prediction is None:
        return 0.0
    if isinstance(golden_answers, str):
        golden_answers = [golden_answers]
    pred = normalize_answer(prediction)
    if not pred:
        return 0.0
    return 1.0 if any(pred == normalize_answer(g) for g in golden_answers) else 0.0


def f1_score(prediction: str | None, golden_answers: Sequence[str] | str) -> float:
    """Best token-level F1 between the prediction and any gold answer (SQuAD rules).

    Like FlashRAG, yes/no/noanswer answers only score when they match exactly.
    """
    if prediction is None:
        return 0.0
    if isinstance(golden_answers, str):
        golden_answers = [golden_answers]
    pred = normalize_answer(prediction)
    best = 0.0
    for gold in golden_answers:
        g = normalize_answer(gold)
        if pred in {"yes", "no", "noanswer"} or g in {"yes", "no", "noanswer"}:
            if pred == g:
                best = max(best, 1.0)
            continue
        pt, gt = pred.split(), g.split()
        common = Counter(pt) & Counter(gt)
        same = sum(common.values())
        if same == 0:
            continue
        p, r = same / len(pt), same / len(gt)
        best = max(best, 2 * p * r / (p + r))
    return best


def answer_in_text(golden_answers: Sequence[str], text: str) -> bool:
    """True when a normalised gold answer occurs (as whole words) in the normalised text."""
    t = f" {normalize_answer(text)} "
    return any(normalize_answer(g) and f" {normalize_answer(g)} " in t for g in golden_answers)
