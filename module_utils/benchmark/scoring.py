"""Answers scored against a prompt set's references: GSM8K (the final number) and MATH (the
last \\boxed{...}), the way the common graders of those sets read a model's output.

Why the benchmark scores at all: the losslessness check compares each speculative config with
the reference config (AR), so a deployment that is broken for every config alike (a
quantisation runtime that yields fluent garbage, a damaged KV cache, a wrong chat template)
passes it. A scored set tells whether AR itself answers right.

Standard library only and Python 3.10 compatible: this runs on GPU hosts under the runtime's
Python. Every output is read from the server, so it is untrusted: only its last
MAX_SCANNED_CHARS characters are read (the answer comes last), every scan is linear, a number
of more than MAX_DIGITS digits is compared as text (Python refuses to convert long digit
strings to int) and what lands in the level file is cut to MAX_SHOWN characters.
"""

from __future__ import annotations

import re
from fractions import Fraction

SCORERS = ("gsm8k", "math")
# A prompt row's reference, as the prompts file keeps it.
MAX_REFERENCE_CHARS = 1024
# extracted and expected as the level file keeps them.
MAX_SHOWN = 128
MAX_SCANNED_CHARS = 1 << 18
MAX_DIGITS = 64
MAX_PHRASES = 16
# How deep \boxed{...} braces are followed; deeper nesting is no answer anyone writes.
MAX_BRACE_DEPTH = 64
# A finished answer is scored; these are cut off (the token budget) or ended by the server.
UNANSWERED_FINISH = ("length", "abort")
REASONING_END = "</think>"

# A number as answers write it: thousands separated by commas or not, decimals, a sign that
# is not a subtraction (no digit, letter or bracket right before it).
_NUMBER = re.compile(r"(?<![\w)\]}.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<![\w.])-?\.\d+")
# "The answer is 18", "Final answer: $18", "#### 18": the number right after the last one.
_ANSWER_PHRASE = re.compile(r"(?i)(?:answer\s*(?:is|:)|####)[\s:=*$\\]*")
_SPACES = re.compile(r"\s+")


def reference_of(scorer: str, raw: str) -> str:
    """The scorer's reference from a dataset row's answer text: GSM8K's solution ends with
    "#### <number>"; MATH-500's answer field is the answer itself."""
    text = raw.strip()
    if scorer == "gsm8k" and "####" in text:
        text = text.rsplit("####", 1)[1].strip()
    return text


def answer_part(text: str) -> str:
    """Where the answer is looked for: after the reasoning's end when the output has one, and
    only its last MAX_SCANNED_CHARS characters."""
    end = text.rfind(REASONING_END)
    if end >= 0:
        text = text[end + len(REASONING_END) :]
    return text[-MAX_SCANNED_CHARS:]


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}) with its braces balanced; None
    when there is none or it never closes. `\\boxed 5` (no braces) gives "5"."""
    starts = [text.rfind("\\boxed"), text.rfind("\\fbox")]
    start = max(starts)
    if start < 0:
        return None
    rest = text[start + (6 if start == starts[0] else 5) :]
    if rest[:1] in (" ", "\t") and rest.lstrip()[:1] != "{":
        word = rest.lstrip().split("$", 1)[0].split(None, 1)
        return word[0] if word else None
    if rest[:1] != "{":
        return None
    depth = 0
    for position, char in enumerate(rest):
        if char == "{":
            depth += 1
            if depth > MAX_BRACE_DEPTH:
                return None
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:position]
    return None


def _number_value(token: str) -> Fraction | None:
    digits = token.replace(",", "").replace("\u2212", "-")
    if sum(c.isdigit() for c in digits) > MAX_DIGITS:
        return None
    try:
        return Fraction(digits)
    except (ValueError, ZeroDivisionError):
        return None


def _canonical(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    # A decimal written out (18.50 -> 18.5) when it is one, else the fraction.
    text = f"{float(value):.12g}"
    return text if Fraction(text) == value else f"{value.numerator}/{value.denominator}"


def _last_number(text: str) -> str | None:
    found = None
    for match in _NUMBER.finditer(text.replace("\u2212", "-")):
        found = match.group(0)
    return found


def _gsm8k_text(text: str) -> str:
    """A GSM8K answer's text with the LaTeX and currency around numbers taken away."""
    text = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r" \1 ", text)
    text = text.replace("{,}", ",")
    for mark in ("\\$", "$", "\\%", "%", "\\!", "\\,", "\\ "):
        text = text.replace(mark, " ")
    return text


def extract_gsm8k(text: str) -> str | None:
    """The final number: in the last \\boxed{}, else after the last "The answer is" (or
    "####", "Answer:"), else the last number of the output; written plainly (1,200.0 as
    1200) when it is one."""
    found = _gsm8k_number(answer_part(text))
    value = _number_value(found) if found is not None else None
    return _canonical(value) if value is not None else found


def _gsm8k_number(part: str) -> str | None:
    boxed = last_boxed(part)
    if boxed is not None:
        number = _last_number(_gsm8k_text(boxed))
        if number is not None:
            return number
    # The last phrase a number follows; an output that repeats the phrase endlessly has only
    # its last few looked at.
    ends = [match.end() for match in _ANSWER_PHRASE.finditer(part)]
    for end in reversed(ends[-MAX_PHRASES:]):
        number = _NUMBER.match(_gsm8k_text(part[end : end + 200]).lstrip())
        if number:
            return number.group(0)
    return _last_number(part)


def gsm8k_equal(extracted: str, expected: str) -> bool:
    mine, theirs = _number_value(extracted), _number_value(_gsm8k_text(expected).strip())
    if mine is not None and theirs is not None:
        return mine == theirs
    return extracted.replace(",", "").strip() == expected.replace(",", "").strip()


# -- MATH ---------------------------------------------------------------------------------

_TEXT = re.compile(r"\\(?:text|textbf|textit|mathrm|mbox|operatorname)\{([^{}]*)\}")
# \text{...} after a value is a unit (10\text{ cm}, 5\text{ inches}): dropped, as graders do.
_UNIT = re.compile(r"(?<=[\d}])\s*\\(?:text|mbox|mathrm)\{\s*[A-Za-z][A-Za-z .^]*\}\s*$")
_FRAC_SHORT = re.compile(r"\\frac(\d)(\d|\{[^{}]*\})|\\frac(\{[^{}]*\})(\d)")
_SQRT_SHORT = re.compile(r"\\sqrt(\w)")
_SIMPLE_FRAC = re.compile(r"^(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}$")
_SLASH_FRAC = re.compile(r"^(-?\d+)/(\d+)$")
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_LEFT_SIDE = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?(?:\([A-Za-z]\))?$")


def normalize_math(answer: str) -> str:
    """An answer in the form the MATH graders compare (Hendrycks et al.'s strip_string and
    the additions of the common MATH-500 graders): no spaces, \\left/\\right, \\!, \\dfrac and
    \\tfrac as \\frac, \\frac12 as \\frac{1}{2}, units and degrees dropped, \\text{X} as X, no
    trailing period, no "x =" before a value, no $ or %, 1,000 as 1000."""
    text = answer.strip()
    text = text.replace("\n", "").replace("\\!", "").replace("\\displaystyle", "")
    text = text.replace("\\\\", "\\")
    text = re.sub(r"\\[,:; ]", " ", text)
    text = text.replace("\\left", "").replace("\\right", "")
    text = text.replace("tfrac", "frac").replace("dfrac", "frac")
    text = text.replace("^{\\circ}", "").replace("^\\circ", "").replace("\u00b0", "")
    text = text.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    text = _UNIT.sub("", text)
    text = _TEXT.sub(r"\1", text)
    text = text.strip().rstrip(".").strip()
    if text.count("=") == 1:
        left, right = text.split("=")
        if _LEFT_SIDE.match(left.strip()):
            text = right
    text = _SPACES.sub("", text)
    text = _FRAC_SHORT.sub(_braced_frac, text)
    text = _SQRT_SHORT.sub(r"\\sqrt{\1}", text)
    text = text.replace("{,}", ",")
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    if text.startswith("."):
        text = "0" + text
    if text.startswith("-."):
        text = "-0" + text[1:]
    slash = _SLASH_FRAC.match(text)
    if slash:
        text = f"\\frac{{{slash.group(1)}}}{{{slash.group(2)}}}"
    return text


def _braced_frac(match: re.Match) -> str:
    if match.group(1) is not None:
        numerator, denominator = match.group(1), match.group(2)
    else:
        numerator, denominator = match.group(3), match.group(4)
    numerator = numerator if numerator.startswith("{") else "{" + numerator + "}"
    denominator = denominator if denominator.startswith("{") else "{" + denominator + "}"
    return f"\\frac{numerator}{denominator}"


def math_value(normalized: str) -> Fraction | None:
    """The value of a normalized answer that is a plain number (18, -0.5, \\frac{1}{2},
    -\\frac{3}{4}), else None: such answers are compared by value."""
    fraction = _SIMPLE_FRAC.match(normalized)
    if fraction:
        sign, numerator, denominator = fraction.groups()
        if len(numerator) + len(denominator) > MAX_DIGITS or int(denominator) == 0:
            return None
        value = Fraction(int(numerator), int(denominator))
        return -value if sign else value
    if re.fullmatch(r"-?(?:\d+(?:\.\d*)?|\.\d+)", normalized):
        return _number_value(normalized)
    return None


def math_equal(extracted: str, expected: str) -> bool:
    mine, theirs = normalize_math(extracted), normalize_math(expected)
    if mine == theirs:
        return True
    values = math_value(mine), math_value(theirs)
    return None not in values and values[0] == values[1]


def extract_math(text: str) -> str | None:
    """The last \\boxed{...} of the answer, its braces balanced."""
    boxed = last_boxed(answer_part(text))
    return boxed.strip() if boxed is not None and boxed.strip() else None


# -- the request's score ------------------------------------------------------------------

EXTRACT = {"gsm8k": extract_gsm8k, "math": extract_math}
EQUAL = {"gsm8k": gsm8k_equal, "math": math_equal}


def score_request(scorer: str, record: dict, expected: str) -> dict:
    """A request record's score for the level file: unanswered when it failed, was cut off
    (finish_reason length) or aborted, or its text is not whole; else correct or wrong (a
    finished answer with nothing to extract is wrong)."""
    shown = expected[:MAX_SHOWN]
    text = record.get("text")
    finished = record.get("ok") and record.get("finish_reason") not in UNANSWERED_FINISH
    if not finished or not isinstance(text, str):
        return {"outcome": "unanswered", "extracted": None, "expected": shown}
    extracted = EXTRACT[scorer](text)
    right = extracted is not None and EQUAL[scorer](extracted, expected)
    return {
        "outcome": "correct" if right else "wrong",
        "extracted": extracted[:MAX_SHOWN] if extracted is not None else None,
        "expected": shown,
    }


def accuracy_summary(scorer: str, records: list[dict]) -> dict:
    """The level summary's `accuracy` from the records' scores. `outcomes` holds one letter
    per request in request-index order (c, w, u), so the analysis can pair two configs'
    answers prompt by prompt without reading every record."""
    ordered = sorted(records, key=lambda record: record["index"])
    outcomes = "".join(record["score"]["outcome"][0] for record in ordered)
    counts = {name: outcomes.count(name[0]) for name in ("correct", "wrong", "unanswered")}
    return {
        "scorer": scorer,
        "n": len(outcomes),
        **counts,
        "accuracy": counts["correct"] / len(outcomes) if outcomes else 0.0,
        "outcomes": outcomes,
    }
