"""Rule-based answer checking for the built-in reward types (`math`, `exact_match`, `f1`).

Cheap and dependency-free on purpose: the final answer is the last `\\boxed{...}` of the
response, else its last number; answers are equal when both parse as numbers that agree
(fractions, decimals, thousands separators, percent signs) or when their normalized strings
match. Tasks that need symbolic equivalence should bring their own `--custom-rm-path`.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from typing import Any

_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")
_FRAC = re.compile(r"^(-?)\\frac\{([^{}]+)\}\{([^{}]+)\}$|^(-?)\\frac(\d)(\d)$")
_TEXT_CMD = re.compile(r"\\(?:text|textbf|mathrm|mathbf|operatorname)\{([^{}]*)\}")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`, or `\\boxed 5`), braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    if text.startswith(" ", i):
        m = re.match(r"\s+([^\s$]+)", text[i:])
        return m.group(1) if m else None
    if not text.startswith("{", i):
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def last_number(text: str) -> str | None:
    matches = _NUMBER.findall(text)
    return matches[-1] if matches else None


def extract_answer(text: str) -> str | None:
    """The final answer of a response: the last boxed expression, else the last number."""
    boxed = last_boxed(text)
    return boxed if boxed is not None else last_number(text)


def normalize(answer: Any) -> str:
    """A canonical string: no TeX spacing or delimiters, `\\text{}` unwrapped, `dfrac` -> `frac`,
    no spaces, no trailing period, lower case."""
    s = str(answer).strip()
    s = _TEXT_CMD.sub(r"\1", s)
    for old, new in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\ ", ""),
                     ("dfrac", "frac"), ("tfrac", "frac"), ("^{\\circ}", ""), ("^\\circ", ""), ("\\%", "%"),
                     ("$", "")):
        s = s.replace(old, new)
    s = re.sub(r"\s+", "", s).rstrip(".")
    if re.match(r"^[a-zA-Z]\s*=", s):  # "x=5" -> "5"
        s = s.split("=", 1)[1]
    return s.lower()


def to_number(answer: Any) -> float | None:
    """The value of a normalized answer, when it is a number, a fraction or a percentage."""
    if isinstance(answer, bool):
        return None
    if isinstance(answer, (int, float)):
        return float(answer)
    s = normalize(answer).rstrip("%")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    m = _FRAC.match(s)
    if m:
        sign, num, den = (m.group(1), m.group(2), m.group(3)) if m.group(2) else (m.group(4), m.group(5), m.group(6))
        s = f"{sign}{num}/{den}"
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            return float(num) / float(den)
        return float(s)
    except (ValueError, ZeroDivisionError):
        return None


def answers_equal(predicted: Any, label: Any) -> bool:
    a, b = to_number(predicted), to_number(label)
    if a is not None and b is not None:
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
    return normalize(predicted) == normalize(label)


def _labels(label: Any) -> list[Any]:
    return list(label) if isinstance(label, (list, tuple)) else [label]


def math_score(response: str, label: Any) -> float:
    """1.0 when the response's final answer equals the label (or one of a list of labels)."""
    predicted = extract_answer(response or "")
    if predicted is None or label is None:
        return 0.0
    for candidate in _labels(label):
        truth = last_boxed(str(candidate)) if isinstance(candidate, str) and "\\boxed" in candidate else candidate
        if answers_equal(predicted, truth):
            return 1.0
    return 0.0


def exact_match_score(response: str, label: Any) -> float:
    """1.0 when the response, whitespace-collapsed and stripped, equals the label (or one of them)."""
    got = " ".join((response or "").split())
    return float(any(label is not None and got == " ".join(str(c).split()) for c in _labels(label)))


def _words(text: str) -> list[str]:
    table = str.maketrans("", "", string.punctuation)
    return str(text).lower().translate(table).split()


def f1_score(response: str, label: Any) -> float:
    """Best word-level F1 (SQuAD style) of the response against the label(s)."""
    best = 0.0
    pred = _words(response or "")
    for candidate in _labels(label):
        truth = _words(candidate)
        common = sum((Counter(pred) & Counter(truth)).values())
        if common:
            p, r = common / len(pred), common / len(truth)
            best = max(best, 2 * p * r / (p + r))
    return best
