"""Deterministic answer-leak check: does a text (a teacher's hint, an evolved prompt) give away
a gold answer in any of the forms a reader would recognise?

Why value-based rather than string-based: "1,234", "1 234", "1234.0", "one thousand two
hundred thirty-four", "\\frac{2468}{2}" and "-1234" all tell a student the answer 1234, but a
substring search for "1234" finds none of them, and it finds "1234" inside "12345". So numbers
are *read* from the text (digits with or without thousands separators, decimals, plain and LaTeX
fractions, simple English number words) and compared by value with the gold answer; the sign is
ignored on purpose (telling a student "-12" when the answer is 12 gives it away too). An answer
that is not a number (a name, a LaTeX expression) is matched as normalised whole tokens.

The check errs on the side of calling something a leak: a rejected hint costs one more teacher
call, a leaked one teaches the student to copy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from fractions import Fraction

__all__ = [
    "answer_forms",
    "answer_value",
    "leaked_answers",
    "leaks",
    "normalize_text",
    "numbers_in",
    "quotes",
    "words",
]

_UNITS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
_WORD_VALUES = {w: i for i, w in enumerate(_UNITS)} | {w: 10 * (i + 2) for i, w in enumerate(_TENS)}
_NUMBER_WORDS = set(_WORD_VALUES) | set(_SCALES)

# thin / non-breaking spaces and LaTeX spacing between digit groups: "1\,234", "1{,}234"
_GROUP_SEPARATORS = re.compile(
    r"(?<=\d)(?:\\,|\\!|\\ |\{,\}|\u202f|\u00a0|\u2009|')(?=\d{3}(?!\d))"
)
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]+?)\s*\}\s*\{\s*([^{}]+?)\s*\}")
_FRAC_SHORT = re.compile(r"\\[dt]?frac\s*(\d)\s*(\d)")
_SLASH = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)(?![\d.]|/)")
# with thousands separators ("1,234", "1 234") and without; both readings are taken
_GROUPED = re.compile(r"(?<![\d.,])\d{1,3}(?:[, ]\d{3})+(?:\.\d+)?(?![\d]|[.,]\d)")
_PLAIN = re.compile(r"(?<![\d.])(?:\d+(?:\.\d+)?|\.\d+)(?!\d|\.\d)")


def normalize_text(text: str) -> str:
    """Lower case, unicode minus as '-', LaTeX group separators dropped, `\\dfrac` as `\\frac`,
    `\\left`/`\\right` and `$` removed, whitespace collapsed."""
    out = text.replace("\u2212", "-").replace("\u2013", "-")
    out = _GROUP_SEPARATORS.sub("", out)
    out = re.sub(r"\\(?:left|right)\b", "", out)
    out = re.sub(r"\\[dt]frac", r"\\frac", out).replace("$", " ")
    return " ".join(out.lower().split())


def _number(text: str) -> Fraction | None:
    try:
        return Fraction(Decimal(text.replace(",", "").replace(" ", "")))
    except (InvalidOperation, ValueError, ZeroDivisionError):
        return None


def answer_value(answer: object) -> Fraction | None:
    """The gold answer as an exact number, if it is one: "12", "1,234", "-3.50", "3/4",
    "\\frac{3}{4}", "\\boxed{7}"; None for anything else."""
    text = normalize_text(str(answer)).strip()
    boxed = re.fullmatch(r"\\boxed\{(.*)\}", text)
    text = (boxed.group(1) if boxed else text).strip()
    sign = -1 if text.startswith("-") else 1
    body = text.lstrip("-+ ")
    whole = _FRAC.fullmatch(body) or _FRAC_SHORT.fullmatch(body) or _SLASH.fullmatch(body)
    if whole:
        num, den = _number(whole.group(1)), _number(whole.group(2))
        if num is None or den is None or den == 0:
            return None
        return sign * num / den
    if re.fullmatch(r"\d{1,3}(?:[, ]\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+", body):
        value = _number(body)
        return None if value is None else sign * value
    return None


def _word_runs(text: str) -> list[list[str]]:
    """Maximal runs of number words ('and' allowed inside a run after a scale word)."""
    words = re.findall(r"[a-z]+", text.replace("-", " "))
    runs: list[list[str]] = []
    current: list[str] = []
    for i, word in enumerate(words):
        if word in _NUMBER_WORDS:
            current.append(word)
        elif (
            word == "and"
            and current
            and current[-1] in _SCALES
            and i + 1 < len(words)
            and words[i + 1] in _WORD_VALUES
        ):
            continue
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def _split_run(run: list[str]) -> list[list[str]]:
    """'one two three' is three numbers, 'twenty one' one, 'three hundred five' one."""
    parts: list[list[str]] = []
    for word in run:
        prev = parts[-1][-1] if parts else None
        joins = prev is not None and (
            word in _SCALES
            or prev in _SCALES
            or (prev in _TENS and word in _WORD_VALUES and 0 < _WORD_VALUES[word] < 10)
        )
        if joins:
            parts[-1].append(word)
        else:
            parts.append([word])
    return parts


def _words_value(words: list[str]) -> int | None:
    total = current = 0
    seen = False
    for word in words:
        if word in _WORD_VALUES:
            current += _WORD_VALUES[word]
            seen = True
        elif word == "hundred":
            current = max(current, 1) * 100
            seen = True
        else:
            total += max(current, 1) * _SCALES[word]
            current = 0
            seen = True
    return total + current if seen else None


def numbers_in(text: str) -> set[Fraction]:
    """Absolute values of every number the (normalised) text states, in any form read here."""
    norm = normalize_text(text)
    found: set[Fraction] = set()
    for pattern in (_FRAC, _FRAC_SHORT, _SLASH):
        for match in pattern.finditer(norm):
            num, den = _number(match.group(1)), _number(match.group(2))
            if num is not None and den:
                found.add(abs(num / den))
    for pattern in (_GROUPED, _PLAIN):
        for match in pattern.finditer(norm):
            value = _number(match.group(0))
            if value is not None:
                found.add(abs(value))
    for run in _word_runs(norm):
        for part in _split_run(run):
            spelt = _words_value(part)
            if spelt is not None:
                found.add(Fraction(spelt))
    return found


def _integer_words(n: int) -> str:
    if n < 20:
        return _UNITS[n]
    if n < 100:
        tens, unit = divmod(n, 10)
        return _TENS[tens - 2] + (f"-{_UNITS[unit]}" if unit else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return f"{_UNITS[hundreds]} hundred" + (f" {_integer_words(rest)}" if rest else "")
    for scale, size in (("billion", 10**9), ("million", 10**6), ("thousand", 10**3)):
        if n >= size:
            head, rest = divmod(n, size)
            return f"{_integer_words(head)} {scale}" + (f" {_integer_words(rest)}" if rest else "")
    raise AssertionError("unreachable")


def answer_forms(answer: object) -> list[str]:
    """Readable forms of a numeric answer that the check catches (for docs, tests and the
    teacher's instructions); a non-numeric answer is its own only form."""
    value = answer_value(answer)
    if value is None:
        return [str(answer).strip()]
    magnitude = abs(value)
    forms: list[str] = []
    if magnitude.denominator == 1:
        n = int(magnitude)
        forms += [str(n), f"{n:,}", f"{n:,}".replace(",", " ")]
        if n < 10**12:
            forms.append(_integer_words(n))
    else:
        forms += [
            f"{magnitude.numerator}/{magnitude.denominator}",
            f"\\frac{{{magnitude.numerator}}}{{{magnitude.denominator}}}",
        ]
        decimal = Decimal(magnitude.numerator) / Decimal(magnitude.denominator)
        if Fraction(decimal) == magnitude:
            forms.append(format(decimal.normalize(), "f"))
    if value < 0:
        forms += [f"-{f}" for f in forms[:1]] + [f"minus {forms[0]}"]
    return list(dict.fromkeys(forms))


def _token_pattern(text: str) -> re.Pattern[str]:
    body = re.escape(normalize_text(text))
    left = r"(?<![\w])" if re.match(r"\w", text.strip()[:1] or " ") else ""
    right = r"(?![\w])" if re.search(r"\w$", text.strip()) else ""
    return re.compile(left + body + right)


def leaks(text: str, answer: object) -> bool:
    """Whether `text` states `answer` (numerically in any form read here, else as whole tokens)."""
    if not str(answer).strip():
        return False
    value = answer_value(answer)
    if value is not None:
        return abs(value) in numbers_in(text)
    return _token_pattern(str(answer)).search(normalize_text(text)) is not None


def leaked_answers(text: str, answers: Iterable[object]) -> list[str]:
    """The answers (as given) that `text` leaks, in order, without duplicates."""
    return [str(a) for a in dict.fromkeys(answers) if leaks(text, a)]


def words(text: str) -> list[str]:
    """Lower-case runs of letters and digits: what `quotes` compares."""
    return re.findall(r"[a-z0-9]+", text.lower())


def quotes(text: str, source: str, n: int | None = 4) -> bool:
    """Whether `text` repeats `source` (a teacher's hint): any `n` consecutive words of it, or
    all of it when it is shorter than `n` words or `n` is None; case and punctuation ignored."""
    said, quoted = words(text), words(source)
    if not quoted:
        return False
    size = len(quoted) if n is None else min(n, len(quoted))
    grams = {tuple(quoted[i : i + size]) for i in range(len(quoted) - size + 1)}
    return any(tuple(said[i : i + size]) in grams for i in range(len(said) - size + 1))
