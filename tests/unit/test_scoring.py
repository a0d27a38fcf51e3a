"""module_utils/benchmark/scoring.py: answers read and compared as GSM8K's and MATH-500's graders
do,
on the answer forms those sets hold and on outputs a broken or hostile server could send."""

from __future__ import annotations

import time

import pytest
from ansible.module_utils.benchmark import scoring
from ansible.module_utils.benchmark.scoring import (
    accuracy_summary,
    extract_gsm8k,
    extract_math,
    gsm8k_equal,
    last_boxed,
    math_equal,
    normalize_math,
    reference_of,
    score_request,
)

# GSM8K test rows 0 and 1 (openai/gsm8k main, test split): the solution ends in "#### N".
GSM8K_SOLUTIONS = [
    (
        "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = "
        "$<<9*2=18>>18 every day at the farmer\u2019s market.\n#### 18",
        "18",
    ),
    (
        "It takes 2/2=<<2/2=1>>1 bolt of white fiber\nSo the total amount of fabric is "
        "2+1=<<2+1=3>>3 bolts of fabric\n#### 3",
        "3",
    ),
    ("The total is 1,000 + 250 = <<1000+250=1250>>1,250\n#### 1,250", "1,250"),
]


@pytest.mark.parametrize(("solution", "reference"), GSM8K_SOLUTIONS)
def test_gsm8k_reference_is_the_number_after_the_marks(solution, reference):
    assert reference_of("gsm8k", solution) == reference
    # MATH-500's answer field is the answer itself, kept whole.
    assert reference_of("math", " \\frac{14}{3} ") == "\\frac{14}{3}"


@pytest.mark.parametrize(
    ("output", "extracted"),
    [
        # The forms models write a final number in.
        ("Janet makes 9 * 2 = 18 dollars.\nThe answer is 18.", "18"),
        ("So the answer is $18.00.", "18"),
        ("Therefore, the final answer is \\boxed{18}.", "18"),
        ("The answer is \\boxed{\\$1,250}", "1250"),
        ("\\boxed{18 \\text{ dollars}}", "18"),
        ("\\boxed{x = 18}", "18"),
        ("#### 1,250", "1250"),
        ("Final Answer: **42**", "42"),
        ("She has 5 - 8 = -3 left, so the answer is -3.", "-3"),
        ("The change is 2.50 dollars.", "2.5"),
        ("It rose by 25%.", "25"),
        # No phrase, no box: the last number, a subtraction's minus not taken for a sign.
        ("She had 20 and gave 5-3 away, keeping 18", "18"),
        ("20 - 2", "2"),
        # A box wins over a later number; the last box wins over an earlier one.
        ("\\boxed{7} (checked in 3 steps)", "7"),
        ("First \\boxed{5}, corrected: \\boxed{6}", "6"),
        # After the reasoning's end only.
        ("<think>It might be 5. Or 6.</think>The answer is 7", "7"),
        ("<think>The answer is 5.</think>\nI cannot say.", None),
        # Unicode digits and minus read as numbers.
        ("The answer is \uff11\uff18", "18"),
        ("The answer is \u22125", "-5"),
        ("\u0661\u0668 apples", "18"),
        ("No number at all.", None),
        ("", None),
    ],
)
def test_gsm8k_extraction(output, extracted):
    assert extract_gsm8k(output) == extracted


@pytest.mark.parametrize(
    ("extracted", "expected", "equal"),
    [
        ("18", "18", True),
        ("18.0", "18", True),
        ("1250", "1,250", True),
        ("-3", "-3", True),
        ("0.5", "0.50", True),
        ("17", "18", False),
        ("180", "18", False),
        ("-18", "18", False),
    ],
)
def test_gsm8k_comparison_is_by_value(extracted, expected, equal):
    assert gsm8k_equal(extracted, expected) is equal


# MATH-500 references as the set holds them (HuggingFaceH4/MATH-500 test.jsonl answers) and
# the forms a correct model output takes.
MATH_EQUAL = [
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{2})"),
    ("p - q", "p-q"),
    ("\\frac{14}{3}", "\\dfrac{14}{3}"),
    ("\\frac{14}{3}", "14/3"),
    ("9", "9.0"),
    ("\\text{Evelyn}", "Evelyn"),
    ("90^\\circ", "90"),
    ("90^\\circ", "90\u00b0"),
    ("3\\sqrt{13}", "3\\sqrt{13}"),
    ("\\$32,348", "32348"),
    ("10", "10\\text{ cm}"),
    ("\\frac{1}{2}", "0.5"),
    ("\\frac12", "\\frac{1}{2}"),
    ("\\sqrt3", "\\sqrt{3}"),
    ("-\\frac{3}{4}", "-0.75"),
    ("5", "x = 5"),
    ("5", "5."),
    ("[-2,7]", "[-2, 7]"),
    ("6 - 5i", "6-5i"),
    ("1000", "1,000"),
    ("0.5", ".5"),
    ("20", "20\\%"),
    ("\\frac{\\sqrt{3}}{2}", "\\tfrac{\\sqrt{3}}{2}"),
]
MATH_DIFFERENT = [
    ("\\frac{14}{3}", "4.6667"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{3})"),
    ("p - q", "q - p"),
    ("9", "-9"),
    ("\\text{Evelyn}", "Amy"),
    ("3\\sqrt{13}", "\\sqrt{13}"),
    ("x = 5", "y = 6"),
]


@pytest.mark.parametrize(("reference", "answer"), MATH_EQUAL)
def test_math_answers_equal_after_normalisation(reference, answer):
    assert math_equal(answer, reference), (normalize_math(answer), normalize_math(reference))


@pytest.mark.parametrize(("reference", "answer"), MATH_DIFFERENT)
def test_math_answers_that_differ_stay_different(reference, answer):
    assert not math_equal(answer, reference)


@pytest.mark.parametrize(
    ("output", "extracted"),
    [
        ("so \\boxed{\\frac{\\sqrt{3}}{2}}.", "\\frac{\\sqrt{3}}{2}"),
        (
            "First \\boxed{1}; finally $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$.",
            "\\left( 3, \\frac{\\pi}{2} \\right)",
        ),
        ("\\fbox{42}", "42"),
        ("The answer is $\\boxed 5$.", "5"),
        ("<think>\\boxed{1}</think>So \\boxed{2}", "2"),
        # Unbalanced, empty or absent: no answer.
        ("\\boxed{\\frac{1}{2}", None),
        ("\\boxed{}", None),
        ("The answer is 5.", None),
    ],
)
def test_math_extraction_is_the_last_balanced_box(output, extracted):
    assert extract_math(output) == extracted


def finished(text: str, **extra) -> dict:
    return {"index": 0, "ok": True, "finish_reason": "stop", "text": text, **extra}


def test_a_request_is_correct_wrong_or_unanswered():
    assert score_request("gsm8k", finished("The answer is \\boxed{18}"), "18") == {
        "outcome": "correct",
        "extracted": "18",
        "expected": "18",
    }
    assert score_request("gsm8k", finished("The answer is 17"), "18")["outcome"] == "wrong"
    # A finished answer with nothing to read is wrong, not unanswered.
    assert score_request("math", finished("I do not know."), "9") == {
        "outcome": "wrong",
        "extracted": None,
        "expected": "9",
    }
    # Cut off at the budget, aborted, failed, or a text that is not whole: unanswered, even
    # when what arrived holds the right number.
    for record in (
        finished("The answer is 18", finish_reason="length"),
        finished("The answer is 18", finish_reason="abort"),
        finished("The answer is 18", ok=False, error="HTTP 500"),
        finished(None, outputs_incomplete=True),
    ):
        assert score_request("gsm8k", record, "18") == {
            "outcome": "unanswered",
            "extracted": None,
            "expected": "18",
        }


def test_what_the_level_file_keeps_is_bounded_but_the_comparison_uses_it_whole():
    long_answer = "\\text{" + "a" * 300 + "}"
    score = score_request("math", finished(f"\\boxed{{{long_answer}}}"), long_answer)
    assert score["outcome"] == "correct"
    assert len(score["extracted"]) == scoring.MAX_SHOWN == len(score["expected"])
    # Equal up to the shown length but not beyond: wrong.
    other = long_answer[:-2] + "b}"
    assert score_request("math", finished(f"\\boxed{{{other}}}"), long_answer)["outcome"] == (
        "wrong"
    )


def test_the_summary_counts_outcomes_in_request_order():
    outcomes = {3: "unanswered", 0: "correct", 2: "correct", 1: "wrong"}
    records = [
        {"index": index, "score": {"outcome": outcome}} for index, outcome in outcomes.items()
    ]
    assert accuracy_summary("gsm8k", records) == {
        "scorer": "gsm8k",
        "n": 4,
        "correct": 2,
        "wrong": 1,
        "unanswered": 1,
        "accuracy": 0.5,
        "outcomes": "cwcu",
    }
    assert accuracy_summary("math", [])["accuracy"] == 0.0


# -- outputs no grader expects -----------------------------------------------------------


def timed(function, *args):
    started = time.perf_counter()
    result = function(*args)
    return result, time.perf_counter() - started


@pytest.mark.parametrize(
    "output",
    [
        "9" * 5000,  # beyond Python's int conversion limit
        "The answer is " + "1" * 100_000,
        "\\boxed{" + "9" * 50_000 + "}",
        "x" * 4_000_000 + " The answer is 18",
        "The answer is " * 300_000,
        "1," * 500_000,
        "-" * 1_000_000 + "5",
        "\\boxed{" * 200_000,
        "{" * 100_000 + "}" * 100_000,
        "\\boxed{" + "{" * 10_000 + "18" + "}" * 10_001,
        "\u202e\u0661\u0668\ufe0f\U0001f600 " * 50_000,
        "\x00\udcff" * 10_000,
    ],
)
def test_hostile_outputs_are_scored_quickly_and_bounded(output):
    for scorer in scoring.SCORERS:
        score, seconds = timed(score_request, scorer, finished(output), "18")
        assert seconds < 2.0, (scorer, seconds)
        assert score["outcome"] in ("correct", "wrong")
        assert score["extracted"] is None or len(score["extracted"]) <= scoring.MAX_SHOWN


def test_hostile_outputs_score_as_a_grader_would():
    # Only the tail is read: the answer at the end of a huge output still counts.
    assert extract_gsm8k("x" * 4_000_000 + " The answer is 18") == "18"
    # A number too long to convert is compared as text, not crashed on.
    assert extract_gsm8k("9" * 5000) == "9" * 5000
    assert not gsm8k_equal("9" * 5000, "18")
    # Braces nested past any real answer are no answer; a sane nesting is read.
    assert last_boxed("\\boxed{" + "{" * 10_000 + "18" + "}" * 10_001) is None
    assert extract_math("\\boxed{\\frac{\\frac{1}{2}}{\\sqrt{\\frac{3}{4}}}}") == (
        "\\frac{\\frac{1}{2}}{\\sqrt{\\frac{3}{4}}}"
    )
    # A zero denominator is not a value.
    assert not math_equal("\\frac{1}{0}", "0")
