"""Answer metrics with FlashRAG's normalisation: the one EM / F1 / accuracy of the project."""
from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
_SPECIAL = ("yes", "no", "noanswer")


def normalize_answer(s: str) -> str:
    """Lower-case, strip punctuation, drop a/an/the, collapse whitespace (SQuAD/FlashRAG)."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def _golds(golden: str | list[str]) -> list[str]:
    return [golden] if isinstance(golden, str) else list(golden)


def exact_match(prediction: str, golden: str | list[str]) -> float:
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in _golds(golden)))


def accuracy(prediction: str, golden: str | list[str]) -> float:
    """1 if a normalised gold answer is contained in the normalised prediction ("acc" / cover-EM).

    FlashRAG's definition, a character substring ("no" is in "not", "2" in "doc 2"): the evaluation's Acc column.
    Rewards use `contains_answer`, which counts whole tokens only."""
    p = normalize_answer(prediction)
    return float(any(normalize_answer(g) in p for g in _golds(golden) if normalize_answer(g)))


_PUNCT_AS_SPACE = str.maketrans({ch: " " for ch in [*_PUNCT, "\u2019"]})


def _token_runs(s: str) -> tuple[str, str]:
    """s normalised as FlashRAG does (punctuation deleted: "Freedonia's" -> "freedonias", "Paris/London" ->
    "parislondon"), and normalised with punctuation read as a token boundary ("freedonia s", "paris london"), so a
    possessive or a slash does not hide the entity. The curly apostrophe is punctuation there too."""
    return normalize_answer(s), normalize_answer(s.translate(_PUNCT_AS_SPACE))


def contains_answer(text: str, golden: str | list[str]) -> float:
    """1 if a normalised gold answer occurs in the normalised text as whole tokens: its token sequence is a
    contiguous run of the text's tokens ("no" is not in "not", "2" not in "2nd", "Paris" not in "Parisian"), in
    either reading of punctuation (`_token_runs`: "Freedonia" is in "Freedonia's army", "Ocean's Eleven" in
    "Oceans Eleven"), else 0; max over the golden answers.

    The "contains the gold answer" of rewards (QAgent's Hit and non-strict EM, DECOR's rule judge), where a
    substring test pays for accidents. Not FlashRAG's Acc (`accuracy`), which stays the evaluation metric."""
    texts = [f" {t} " for t in _token_runs(text)]
    return float(any(g and f" {g} " in t for x in _golds(golden) for g, t in zip(_token_runs(x), texts)))


def token_prf(prediction: str, gold: str) -> tuple[float, float, float]:
    """(precision, recall, f1) over normalised tokens; yes/no/noanswer must match exactly, else 0."""
    p, g = normalize_answer(prediction), normalize_answer(gold)
    if (p in _SPECIAL or g in _SPECIAL) and p != g:
        return 0.0, 0.0, 0.0
    pt, gt = p.split(), g.split()
    common = sum((Counter(pt) & Counter(gt)).values())
    if common == 0:
        return 0.0, 0.0, 0.0
    prec, rec = common / len(pt), common / len(gt)
    return prec, rec, 2 * prec * rec / (prec + rec)


def f1_score(prediction: str, golden: str | list[str]) -> float:
    return max(token_prf(prediction, g)[2] for g in _golds(golden))


def precision_score(prediction: str, golden: str | list[str]) -> float:
    return max(token_prf(prediction, g)[0] for g in _golds(golden))


def has_answer(prediction: str | None) -> bool:
    """False for a prediction with nothing to score: empty, or nothing left after normalisation ("", "?", "the")."""
    return bool(normalize_answer(prediction or ""))


def answer_metrics(prediction: str, golden: str | list[str]) -> dict[str, float]:
    return {"em": exact_match(prediction, golden), "f1": f1_score(prediction, golden),
            "acc": accuracy(prediction, golden)}
