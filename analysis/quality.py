"""The quality gate: answers scored against reference sets, and the OpenAI API checked.

Losslessness compares every config with the reference config's greedy outputs, so a broken
reference (a runtime that misreads the quantised weights, a damaged KV cache, a wrong chat
template) passes it: every config agrees with garbage. Scored prompt sets catch that:

- accuracy_below_ar: a config answers fewer prompts right than the reference on the same
  prompts by more than chance allows. The two runs answer the same prompts, so the test is
  the exact two-sided McNemar test on the discordant pairs (prompts one got right and the
  other did not); paired per host, prompt set and concurrency level (and TP size, as the
  speedups are), and only when both levels were built from the same prompts file.
- accuracy_below_floor: the reference itself scores below the floor the model's data sets
  for that prompt set (run.json model.accuracy_floors, each with its source).
- api_check_failed: a check of <host>/<config>/api-check.json (the server stage's checks of
  /v1/models, chat, streamed chat, tool calls and reasoning) failed.
"""

from __future__ import annotations

import math

from analysis.keys import at_tp, is_reference, level_key, rows_by_file
from analysis.results import Results, accuracy_floors, config_order

SIGNIFICANCE = 0.05
# Above this share of unanswered (cut off, failed) requests, a low accuracy is first of all a
# budget problem: the floor's message says how to give the answers room.
MANY_UNANSWERED = 0.1
# Exact binomial sums in integers up to this many discordant pairs; above, in logarithms.
EXACT_PAIRS = 20_000
# Text from api-check.json shown in a message or a table cell.
SHOWN_CHARS = 400


def mcnemar_p(worse: int, better: int) -> float:
    """The exact two-sided McNemar p-value of `worse` prompts only the reference got right
    against `better` prompts only the config got right: under no difference each discordant
    pair goes either way with probability 1/2, so p = 2 P(Binomial(n, 1/2) <= min), capped at
    1."""
    n, low = worse + better, min(worse, better)
    if n == 0:
        return 1.0
    if n <= EXACT_PAIRS:
        total, term = 0, 1
        for k in range(low + 1):
            total += term
            term = term * (n - k) // (k + 1)
        return min(1.0, 2 * total / 2**n)
    base = math.lgamma(n + 1) - n * math.log(2)
    logs = [base - math.lgamma(k + 1) - math.lgamma(n - k + 1) for k in range(low + 1)]
    top = max(logs)
    return min(1.0, 2 * math.exp(top) * sum(math.exp(v - top) for v in logs))


def _accuracy(level) -> dict | None:
    accuracy = level.summary.get("accuracy")
    return accuracy if isinstance(accuracy, dict) else None


def _sha(level) -> str | None:
    prompts = level.provenance.get("prompts") or {}
    sha = prompts.get("sha256")
    return sha if isinstance(sha, str) and sha else None


def accuracy_rows(results: Results, table: list[dict], reference: str) -> list[dict]:
    """One row per scored level: its counts, and against the reference config's level at the
    same host, prompt set, concurrency and TP size, the discordant pairs, McNemar's p and the
    verdict (or why it was not compared)."""

    # Each level file's row (repeats of a level share one); levels are paired repeat by
    # repeat, and at rate levels by rate.
    by_file = rows_by_file(table)
    references: dict[tuple, dict] = {}
    for level in results.levels:
        row = by_file[level.path]
        if _accuracy(level) and is_reference(level.config, reference):
            references.setdefault(level_key(level), {})[row["tp_size"]] = level
    out = []
    for level in results.levels:
        row = by_file[level.path]
        accuracy = _accuracy(level)
        if accuracy is None:
            continue
        entry = {
            "host": level.host,
            "prompt_set": level.prompt_set,
            "config": level.config,
            "concurrency": level.concurrency,
            "scorer": accuracy["scorer"],
            "n": accuracy["n"],
            "correct": accuracy["correct"],
            "wrong": accuracy["wrong"],
            "unanswered": accuracy["unanswered"],
            "accuracy": accuracy["correct"] / accuracy["n"] if accuracy["n"] else None,
            "reference": None,
            "reference_accuracy": None,
            "only_reference_right": None,
            "only_config_right": None,
            "p_value": None,
            "verdict": None,
            "note": "",
            "max_new_tokens": level.settings.get("max_new_tokens"),
            "chat_template_kwargs": level.provenance.get("chat_template_kwargs"),
        }
        out.append(entry)
        if is_reference(level.config, reference):
            entry["verdict"] = "reference"
            continue
        if not accuracy["n"]:
            entry["note"] = "not compared: no request scored"
            continue
        base = at_tp(references, level_key(level), row["tp_size"])
        if base is None:
            entry["note"] = (
                f"not compared: no scored {reference} level at this prompt set and level"
            )
            continue
        entry["reference"] = base.config
        counts = _accuracy(base)
        entry["reference_accuracy"] = counts["correct"] / counts["n"] if counts["n"] else None
        mine, theirs = _sha(level), _sha(base)
        if mine is None or mine != theirs:
            entry["note"] = (
                f"not compared: the prompts differ from {base.config}'s (prompts sha256 "
                f"{(mine or 'not recorded')[:12]} against {(theirs or 'not recorded')[:12]}), "
                "so request i did not get the same prompt in both"
            )
            continue
        ours, refs = accuracy["outcomes"], counts["outcomes"]
        pairs = min(len(ours), len(refs))
        if not pairs:
            entry["note"] = f"not compared: {base.config} scored no request here"
            continue
        lost = sum(r == "c" and o != "c" for o, r in zip(ours[:pairs], refs[:pairs], strict=True))
        won = sum(o == "c" and r != "c" for o, r in zip(ours[:pairs], refs[:pairs], strict=True))
        p = mcnemar_p(lost, won)
        entry.update(only_reference_right=lost, only_config_right=won, p_value=p)
        if p < SIGNIFICANCE:
            entry["verdict"] = "worse" if lost > won else "better"
        else:
            entry["verdict"] = "same"
        if pairs != max(len(ours), len(refs)):
            entry["note"] = f"paired over the first {pairs} requests, the ones both levels ran"
    return out


ACCURACY_COLUMNS = (
    "host",
    "prompt_set",
    "config",
    "concurrency",
    "scorer",
    "n",
    "correct",
    "wrong",
    "unanswered",
    "accuracy",
    "reference_accuracy",
    "only_reference_right",
    "only_config_right",
    "p_value",
    "verdict",
    "note",
)


def _figures(entry: dict) -> str:
    accuracy = "undefined" if entry["accuracy"] is None else f"{entry['accuracy']:.3f}"
    return (
        f"accuracy {accuracy} ({entry['correct']} of {entry['n']} right, "
        f"{entry['wrong']} wrong, {entry['unanswered']} unanswered)"
    )


def accuracy_warnings(results: Results, rows: list[dict], reference: str) -> list[dict]:
    """accuracy_below_ar per level a config answers significantly worse than the reference;
    accuracy_below_floor per host, reference config and prompt set below the model's floor."""
    found = []
    for entry in rows:
        if entry["verdict"] != "worse":
            continue
        found.append(
            {
                "kind": "accuracy_below_ar",
                "severity": "warning",
                "where": f"{entry['host']} / {entry['config']} / {entry['prompt_set']} / "
                f"c{entry['concurrency']}",
                "message": (
                    f"{_figures(entry)} against {entry['reference']}'s "
                    f"{entry['reference_accuracy']:.3f} on the same prompts: "
                    f"{entry['only_reference_right']} prompts right only for "
                    f"{entry['reference']}, {entry['only_config_right']} right only for "
                    f"{entry['config']} (exact McNemar test, p = {entry['p_value']:.2g} < "
                    f"{SIGNIFICANCE:g}). Speculative decoding that verifies correctly never "
                    "changes answers at temperature 0: check this config's losslessness, its "
                    "drafter and launch flags (Provenance), and the runtime it ran on"
                ),
            }
        )
    floors = accuracy_floors(results.run)
    below: dict[tuple, list[dict]] = {}
    for entry in rows:
        floor = floors.get(entry["prompt_set"])
        if (
            entry["verdict"] == "reference"
            and floor
            and entry["accuracy"] is not None
            and entry["accuracy"] < floor["floor"]
        ):
            below.setdefault((entry["host"], entry["config"], entry["prompt_set"]), []).append(
                entry
            )
    for (host, config, prompt_set), entries in sorted(below.items()):
        floor = floors[prompt_set]
        levels = "; ".join(f"{_figures(e)} at c{e['concurrency']}" for e in entries)
        unanswered = sum(e["unanswered"] for e in entries)
        total = sum(e["n"] for e in entries)
        message = (
            f"{config}, the reference, scores {prompt_set} below the floor of "
            f"{floor['floor']:.2f} ({floor['source'] or 'source not recorded'}): {levels}. "
            "Every config is checked against the reference, so losslessness cannot see this: "
            "check the runtime's support for the weights' quantisation (compressed-tensors "
            "version), the KV cache dtype and the chat template"
        )
        if total and unanswered / total > MANY_UNANSWERED:
            budget = entries[0]["max_new_tokens"]
            kwargs = entries[0]["chat_template_kwargs"]
            message += (
                f". {unanswered} of {total} answers were cut off or failed (max_new_tokens "
                f"{budget if budget is not None else 'unknown'}): raise "
                f"benchmark_prompt_set_definitions.{prompt_set}.max_new_tokens, or turn "
                "thinking off for scored sets (benchmark_scored_chat_template_kwargs; this set "
                f"was rendered with {kwargs if kwargs is not None else 'kwargs not recorded'})"
            )
        found.append(
            {
                "kind": "accuracy_below_floor",
                "severity": "error",
                "where": f"{host} / {config} / {prompt_set}",
                "message": message,
            }
        )
    return found


def _text(value) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def api_check_rows(results: Results) -> list[dict]:
    """One row per check of every host's and config's api-check.json."""

    out = []
    for (host, config), record in sorted(
        results.api_checks.items(), key=lambda i: (i[0][0], config_order(i[0][1]))
    ):
        for check in record["checks"]:
            passed = check["passed"]
            out.append(
                {
                    "host": host,
                    "config": config,
                    "check": check["name"],
                    "result": "passed" if passed else "not run" if passed is None else "failed",
                    "found": _text(check.get("found")),
                    "expected": _text(check.get("expected")),
                    "fix": _text(check.get("fix")),
                    "ms": check.get("ms"),
                    "checked_at": _text(record.get("checked_at")),
                    "served_model_name": _text(record.get("served_model_name")),
                }
            )
    return out


API_CHECK_COLUMNS = ("host", "config", "check", "result", "found", "expected", "fix", "ms")


def api_check_warnings(rows: list[dict]) -> list[dict]:
    return [
        {
            "kind": "api_check_failed",
            "severity": "error",
            "where": f"{row['host']} / {row['config']}",
            "message": (
                f"the OpenAI API check {row['check']} failed: found {row['found'] or '(nothing)'}"
                f"; expected {row['expected'] or '(not recorded)'}; "
                f"fix: {row['fix'] or '(none recorded)'}"
            ),
        }
        for row in rows
        if row["result"] == "failed"
    ]
