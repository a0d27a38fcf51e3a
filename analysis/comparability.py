"""Whether two runs can be compared: every recorded difference that could explain a
difference in their results, one warning per differing field.

compare() calls check(results_a, results_b). A run's value of a field is the set of distinct
values it takes over the run's levels (every host, every level) and run.json; a field differs
when the two runs' sets differ, and then gives exactly one warning, never one per level or
host:

    {"kind": "not_comparable" | "expected_difference", "severity": "warning",
     "where": FIELD, "field": FIELD, "message": "FIELD: A <a>, B <b> (why it matters)",
     "a": <value, or a list of them>, "b": ...}

A field only one run records (an older writer, a missing record) is unknown, not different,
and gives no warning; so does anything identical. Run ids, times, host names, the server's
address (base_url, --host, --port, --dist-init-addr) and local model paths are never compared:
the weights are, by repository and revision.

expected_difference marks what comparing hardware or models on purpose changes: the GPU model,
the interconnect, an explicit hardware profile, the GPU count when the GPUs differ, attention
backend flags, the model (run.json model.name and target repository), and, when the model
differs, what follows from it (launch argv and environment, drafters, accuracy floors).

Everything read comes from files: any type is compared as its JSON text (0 and 0.0 are one
temperature), long values as their sha256, and every value shown and every message is cut to
a bound. Secret-looking environment variables and --api-key are compared as masked.

The study lock the run used (run.json `lock`, issue 20) feeds the same fields and a few of
its own: comparability_facts.lock_values() says which. How one value is compared and shown is
in comparability_values.py, what one run records in comparability_facts.py.
"""

from __future__ import annotations

import re

from analysis.comparability_facts import SETTINGS, Facts, facts
from analysis.comparability_values import ABSENT, Seen, as_dict, canonical, package_set

NOT_COMPARABLE, EXPECTED = "not_comparable", "expected_difference"
KINDS = (NOT_COMPARABLE, EXPECTED)

# Bounds on a warning: the flags a launch warning lists, and its message.
MAX_ENTRIES = 12
MAX_MESSAGE = 1500
WHY = {
    "prompts.sha256": "other prompts, other results",
    "prompts.workload": "another synthetic workload (seed, tokenizer) is other prompts",
    "prompts.chat_template_kwargs": "the chat template switches change the rendered prompts",
    "model": "another model",
    "model.accuracy_floors": "the accuracy gate differs",
    "weights.revision": "other weights",
    "datasets.revision": "another revision of the prompt dataset",
    "git.commit": "another source checkout",
    "runtime.release": "another SGLang release",
    "runtime.git.commit": "another SGLang build (the DDTree runtime)",
    "runtime.git.patches": "other patches on the SGLang build",
    "runtime.packages": "another installed package set (kernels, torch, flashinfer)",
    "runtime.python": "another Python under the runtime",
    "launch.argv": "the server was launched differently",
    "launch.attention_backend": "another attention kernel",
    "launch.environment": "the server's environment (NCCL and others) differs",
    "gpu.models": "other GPUs",
    "gpu.count": "another GPU count",
    "gpu.profile": "another hardware profile",
    "gpu.interconnect": "another interconnect",
    "gpu.driver_version": "another NVIDIA driver",
    "gpu.cuda_version": "another CUDA version",
}
ORDER = (
    "settings.",
    "prompts[",
    "model",
    "weights[",
    "datasets[",
    "runtime.",
    "git[",
    "launch[",
    "gpu.",
)
ATTENTION_BACKEND = re.compile(r"^--(?:[a-z0-9]+-)*attention-backend$")

# analysis/results.py reads each runtime's package set as this module gives it.
__all__ = ["EXPECTED", "KINDS", "NOT_COMPARABLE", "check", "counts", "package_set", "warning"]


def check(results_a, results_b) -> list[dict]:
    """The comparability warnings of run B against run A, in a fixed order."""
    a, b = facts(results_a), facts(results_b)

    def differs(name: str) -> bool:
        if name not in a.fields or name not in b.fields:
            return False
        if _group(name) == "runtime.packages":
            return _package_sets_differ(a.fields[name], b.fields[name])
        return a.fields[name].keys != b.fields[name].keys

    model_differs = differs("model")
    hardware_differs = bool(a.hardware.keys and b.hardware.keys) and (
        a.hardware.keys != b.hardware.keys
    )
    found = []
    for name in sorted(set(a.fields) & set(b.fields), key=_order):
        if not differs(name):
            continue
        group = _group(name)
        if group == "prompts.sha256" and differs(name.replace(".sha256", ".workload")):
            continue  # the workload's own warning says what changed in its prompts
        if group in ("model", "gpu.models", "gpu.interconnect", "gpu.profile"):
            kind = EXPECTED
        elif group == "gpu.count":
            kind = EXPECTED if hardware_differs else NOT_COMPARABLE
        elif group == "model.accuracy_floors":
            kind = EXPECTED if model_differs else NOT_COMPARABLE
        else:
            kind = NOT_COMPARABLE
        why = SETTINGS.get(name.removeprefix("settings."), "") or WHY.get(group, "")
        if kind == EXPECTED and group in ("gpu.count", "model.accuracy_floors"):
            why += f"; expected, as the {'GPUs' if group == 'gpu.count' else 'models'} differ"
        found.append(
            warning(
                kind,
                name,
                f"{name}: A {a.fields[name].text()}, B {b.fields[name].text()} ({why})",
                a.fields[name].summary(),
                b.fields[name].summary(),
            )
        )
    found += _launch(a, b, model_differs)
    return sorted(found, key=lambda w: _order(w["field"]))


def _package_sets_differ(seen_a: Seen, seen_b: Seen) -> bool:
    """Whether two runs' package sets differ, by hashes when both know them for every set,
    else by versions: a set recorded without hashes (no lock, an older run) is not another
    set for that alone."""
    values = [*seen_a.values.values(), *seen_b.values.values()]
    hashed = all(isinstance(v, dict) and v.get("hashes") for v in values)

    def keys(seen: Seen) -> frozenset:
        out = set()
        for value in seen.values.values():
            digests = as_dict(value)
            key = digests.get("sha256" if hashed else "versions_sha256") or digests.get("sha256")
            out.add(str(key) if key is not None else canonical(value))
        return frozenset(out) | ({"(more)"} if seen.more else frozenset())

    return keys(seen_a) != keys(seen_b)


def _group(name: str) -> str:
    """A field's kind of field: prompts[gsm8k].sha256 -> prompts.sha256."""
    group = re.sub(r"\[[^\]]*\]", "", name)
    for prefix in ("runtime.packages", "runtime.python"):
        if group.startswith(prefix):
            return prefix
    return group


def _order(name: str) -> tuple:
    rank = next((i for i, prefix in enumerate(ORDER) if name.startswith(prefix)), len(ORDER))
    return (rank, name)


def warning(kind: str, where: str, message: str, a, b, **extra) -> dict:
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    return {
        "kind": kind,
        "severity": "warning",
        "where": where,
        "field": where,
        "message": message,
        "a": a,
        "b": b,
        **extra,
    }


def _differences(side_a: dict, side_b: dict) -> list[tuple[str, Seen, Seen]]:
    """Per flag (or variable) the values of each run's distinct launches of one config, a
    launch without it giving ABSENT; the flags whose sets differ."""
    out = []
    launches_a, launches_b = list(side_a.values()), list(side_b.values())
    names = sorted({n for launch in launches_a + launches_b for n in launch})
    for name in names:
        seen_a, seen_b = Seen(), Seen()
        for launch in launches_a:
            seen_a.add(launch.get(name, ABSENT))
        for launch in launches_b:
            seen_b.add(launch.get(name, ABSENT))
        if seen_a.keys != seen_b.keys:
            out.append((name, seen_a, seen_b))
    return out


def _launch(a: Facts, b: Facts, model_differs: bool) -> list[dict]:
    """Per config both runs launched, its argv and environment as a diff; configs whose diff
    is the same (one kit-wide setting changed) share one warning."""
    groups: dict[tuple, list[str]] = {}
    diffs: dict[tuple, list] = {}
    for part, store_a, store_b in (
        ("argv", a.argv, b.argv),
        ("environment", a.environment, b.environment),
    ):
        for config in sorted(set(store_a) & set(store_b)):
            found = _differences(store_a[config], store_b[config])
            if part == "argv":
                backends = [d for d in found if ATTENTION_BACKEND.match(d[0])]
                others = [d for d in found if not ATTENTION_BACKEND.match(d[0])]
                split = (("attention_backend", backends), ("argv", others))
            else:
                split = (("environment", found),)
            for name, entries in split:
                if not entries:
                    continue
                signature = (name, tuple((n, x.keys, y.keys) for n, x, y in entries))
                groups.setdefault(signature, []).append(config)
                diffs[signature] = entries
    out = []
    for signature, configs in groups.items():
        name, entries = signature[0], diffs[signature]
        more = f",+{len(configs) - 6}" if len(configs) > 6 else ""
        where = f"launch[{','.join(configs[:6])}{more}].{name}"
        kind = EXPECTED if name == "attention_backend" or model_differs else NOT_COMPARABLE
        why = WHY[f"launch.{name}"]
        if model_differs and name != "attention_backend":
            why += "; expected, as the models differ"
        lines = [f"{flag} A {x.text()}, B {y.text()}" for flag, x, y in entries[:MAX_ENTRIES]]
        if len(entries) > MAX_ENTRIES:
            lines.append(f"and {len(entries) - MAX_ENTRIES} more")
        out.append(
            warning(
                kind,
                where,
                f"{where}: {'; '.join(lines)} ({why})",
                {flag: x.summary() for flag, x, _ in entries[:32]},
                {flag: y.summary() for flag, _, y in entries[:32]},
                configs=configs[:200],
            )
        )
    return out


def counts(warnings: list[dict]) -> dict[str, int]:
    return {kind: sum(w.get("kind") == kind for w in warnings) for kind in KINDS}
