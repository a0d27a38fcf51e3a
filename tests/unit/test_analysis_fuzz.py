"""The analysis against 1,000 seeded mutations of a valid results tree: type swaps, deletions,
negative, NaN and huge numbers, odd strings and wrong nesting, in the level files, run.json,
status.json and lossless.json. Every mutation runs the command line in-process (main()); each
must end in a report (exit 0) or a refusal (exit 2) whose every problem names a file and a
field, never in an exception."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import random
import re
import shutil
import time

import pytest

from analysis.__main__ import main
from tests.support.results_tree import GPU_SUMMARY, Plan, Sim, write_run

pytestmark = pytest.mark.analysis

MUTATIONS = 1000
SEED = 16
# Values that stand in for another: every JSON type, and the edges of each.
VALUES = [
    "",
    "x",
    "-1",
    "²",  # a digit to str.isdigit(), not to int()
    "../../etc",
    "a" * 300,
    0,
    -1,
    -2.5,
    7,
    3.5,
    10**30,
    1e300,
    True,
    False,
    None,
    [],
    {},
    [1, "a"],
    {"a": 1},
    {"count": -1},
]
# Numbers JSON can spell but Python's json turns into non-finite or oversized values.
RAW = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "9" * 400]
# A refusal of a level file names the field mutated, one inside or above it, or one of the
# fields whose check compares others (the record counts, the file name, the schema version).
CROSS_CHECKED = ("summary.requests_ok", "concurrency", "schema_version", "config", "prompt_set")
# 'file: field: what', the field a JSON path (keys with other characters quoted in brackets).
PROBLEM = re.compile(
    r'^  (\S+): ((?:[\w:.-]|\[(?:\d+|"(?:[^"\\]|\\.)*")\])+|\(top level\)|\(file\)): \S'
)
PLAIN_KEY = re.compile(r"^[A-Za-z0-9_:-]+$")


def paths(value, prefix=()) -> list[tuple]:
    """Every path into value, lists cut to their first three items (a record's events, ids)."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:3]):
            found += paths(item, (*prefix, index))
    return found


def field_of(path: tuple) -> str:
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif PLAIN_KEY.match(part):
            text += f".{part}" if text else part
        else:
            text += f"[{json.dumps(part)}]"
    return text


def mutate(document, rng: random.Random) -> tuple[object, tuple, str, str | None]:
    """(the mutated document, the path changed, what was done, a raw number to splice in)."""
    document = copy.deepcopy(document)
    path = rng.choice(paths(document))
    parent = document
    for part in path[:-1]:
        parent = parent[part]
    key = path[-1]
    roll = rng.random()
    raw = None
    if roll < 0.15:
        del parent[key]
        what = "deleted"
    elif roll < 0.30:
        raw = rng.choice(RAW)
        parent[key] = "__RAW__"
        what = f"set to {raw}"
    elif roll < 0.40:
        # Wrong nesting: the value wrapped one level deeper, or its parent's copy nested in it.
        parent[key] = rng.choice([[parent[key]], {"value": parent[key]}, copy.deepcopy(parent)])
        what = "nested"
    elif roll < 0.48 and isinstance(parent[key], (int, float)) and parent[key] is not True:
        parent[key] = -abs(parent[key]) - rng.choice([0, 1, 0.5])
        what = "negated"
    else:
        parent[key] = copy.deepcopy(rng.choice(VALUES))
        what = f"set to {json.dumps(parent[key])[:40]}"
    return document, path, what, raw


def related(field: str, path: tuple) -> bool:
    mutated = field_of(path)
    return (
        field in ("(top level)", "(file)")
        or field.startswith(mutated)
        or mutated.startswith(field)
        or field in CROSS_CHECKED
        or field.startswith("requests")
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz") / "run"
    # A rate level beside the closed loop (so each level carries request_rate, arrival,
    # repeat and repeats), fill, and GPU telemetry on dflash's: every field the analysis
    # reads is mutated.
    plan = Plan(
        configs={"ar": Sim(), "dflash": Sim(step_ms=25, accept=4)},
        concurrency=(1,),
        num_prompts=2,
        max_new_tokens=4,
        request_rates=(1.0,),
        unique_prompts=2,
        gpu={"dflash": GPU_SUMMARY},
    )
    return write_run(root, plan)


# Most mutations the analysis accepts change only what no plot reads (provenance, the run's
# name): tests/unit/conftest.py draws each figure once per distinct input, and every figure
# whose input differs in full, as in a report.
def test_a_thousand_mutations_end_in_a_report_or_a_named_refusal(tree, tmp_path):
    targets = {
        "node-a/dflash/gsm8k/c1.json": 0.55,
        "node-a/ar/gsm8k/c1.json": 0.15,
        "run.json": 0.1,
        "node-a/lossless.json": 0.1,
        "node-a/dflash/status.json": 0.1,
    }
    originals = {name: (tree / name).read_bytes() for name in targets}
    documents = {name: json.loads(data) for name, data in originals.items()}
    rng = random.Random(SEED)
    failures: list[str] = []
    outcomes = {0: 0, 2: 0}
    clock = time.monotonic()
    for number in range(MUTATIONS):
        name = rng.choices(list(targets), weights=list(targets.values()))[0]
        document, path, what, raw = mutate(documents[name], rng)
        text = json.dumps(document, indent=1) + "\n"
        if raw is not None:
            text = text.replace('"__RAW__"', raw)
        (tree / name).write_text(text)
        label = f"#{number} {name} {field_of(path)} {what}"
        out = tmp_path / f"out-{number}"
        stdout, stderr = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                status = main(["report", str(tree), "--out", str(out), "--workers", "1"])
        except BaseException as error:  # any escape is the finding, SystemExit included
            failures.append(f"{label}: {type(error).__name__}: {error}")
            status = None
        finally:
            (tree / name).write_bytes(originals[name])
        shutil.rmtree(out, ignore_errors=True)
        if status is None:
            continue
        errors = stderr.getvalue()
        if status not in outcomes or "Traceback" in errors:
            failures.append(f"{label}: exit {status}: {errors[-500:]}")
            continue
        outcomes[status] += 1
        if status == 0:
            continue
        lines = errors.splitlines()
        problems = [PROBLEM.match(line) for line in lines[1:] if not line.startswith("  ...")]
        if not lines or "problem(s) with the results" not in lines[0] or not all(problems):
            failures.append(f"{label}: a problem without file and field: {errors[:600]}")
            continue
        mine = [m.group(2) for m in problems if m.group(1) == name]
        if not mine:
            failures.append(f"{label}: no problem names {name}: {errors[:600]}")
        elif name.endswith("c1.json") and not any(related(f, path) for f in mine):
            failures.append(f"{label}: the problems name other fields: {errors[:600]}")
    seconds = time.monotonic() - clock
    assert failures == [], f"{len(failures)} of {MUTATIONS}:\n" + "\n".join(failures[:40])
    # Both ends are exercised: a fuzz that only ever refused would test nothing past reading.
    assert outcomes[0] >= 50 and outcomes[2] >= 500, outcomes
    print(f"{MUTATIONS} mutations in {seconds:.1f} s: {outcomes}")


def test_hostile_host_names_reach_no_plot_terminal_or_markdown_as_code(tmp_path, capsys):
    """Hardening II (6, 7): a `$` pair made matplotlib parse a host name as math and the report
    crash; an escape sequence in a folder name reached the terminal raw, and HTML in one
    reached summary.md as markup."""
    from analysis.__main__ import main
    from tests.support.results_tree import Plan, Sim, write_run

    hosts = {"gpu$\\frac{a$-1": "ct200", "n2\x1b[2J\x1b[H<img src=x onerror=alert(1)>": "h200"}
    plan = Plan(
        hosts=hosts, configs={"ar": Sim(), "dflash": Sim(step_ms=25, accept=4)}, concurrency=(1, 2)
    )
    root = write_run(tmp_path / "run", plan)
    assert main(["report", str(root), "--out", str(tmp_path / "report")]) == 0
    said = capsys.readouterr()
    assert "\x1b" not in said.out + said.err
    assert "recommended on n2?[2J?[H<img src=x onerror=alert(1)> by" in said.out
    markdown = (tmp_path / "report" / "summary.md").read_text()
    # Markup only inside code spans, where it is shown as it is.
    prose = re.sub(r"`[^`\n]*`", "", markdown)
    assert "<img" not in prose and "&lt;img src=x onerror=alert(1)&gt;" in prose
    assert "\x1b" not in markdown
    assert (tmp_path / "report" / "plots" / "throughput.png").stat().st_size > 0
