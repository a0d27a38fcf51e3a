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
its own: lock_values() says which.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field

from ansible.module_utils.contract.level import NOT_FROZEN
from ansible.module_utils.contract.secrets import MASK, SECRET_FLAGS, is_secret_name

NOT_COMPARABLE, EXPECTED = "not_comparable", "expected_difference"
KINDS = (NOT_COMPARABLE, EXPECTED)

ABSENT = "(absent)"  # a flag or variable one run's launch does not have
SET = "(set)"  # a flag without a value
# Bounds on what files may hold: a value's key (longer ones are compared by sha256), values
# kept per field, argv items and their length, what a message or a summary shows.
MAX_KEY = 512
MAX_DISTINCT = 1000
MAX_ARGS = 1000
MAX_ARG = 1000
MAX_SHOWN = 120
MAX_SUMMARY_VALUES = 8
MAX_ENTRIES = 12
MAX_MESSAGE = 1500
MAX_NAME = 200
MAX_PACKAGES = 20_000
_SEPARATORS = re.compile(r"[-_.]+")  # PEP 503 name normalisation
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

# Level settings, each compared as `settings.<name>` (run.json's when no level records it).
SETTINGS = {
    "num_prompts": "a level's request count and prompt variety move throughput and tails",
    "max_new_tokens": "output length sets the decode share of every request",
    "temperature": "sampling changes acceptance and output lengths",
    "warmup_requests": "warm-up decides what the first level finds cached and compiled",
    "requests_per_concurrency": "a closed-loop level's size",
    "rate_duration_s": "a rate level's size",
    "max_concurrency": "the cap on requests in flight at rate levels",
    "level_time_budget_s": "a level stopped by its time budget sends fewer requests",
    "repeats": "repeats decide the intervals a difference is judged by",
    "telemetry": "GPU sampling costs the client host CPU",
    "telemetry_interval_ms": "GPU sampling costs the client host CPU",
}
# Taken from run.json first: a level file records its own repeat count only since issue 19.
# (Which workloads and sets a run planned is no setting: a level only one run has is listed
# as such, and each workload both ran is compared by its definition.)
RUN_FIRST = {"repeats"}
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
# Launch flags whose values are where the server listens or a local path: the address is no
# property of the measurement, and a model folder's contents are compared as its weights'
# repository and revision (the path flags show those instead of the path).
IGNORED_FLAGS = {"--host", "--port", "--dist-init-addr"}
# The runtime version's folder the kit puts in the launch environment (so that a switch
# restarts the server): a local path, whose contents are compared as the runtime's packages.
IGNORED_ENVIRONMENT = {"KIMI_RUNTIME_DIR"}
WEIGHT_FLAGS = {"--model-path": "target", "--speculative-draft-model-path": "drafter"}
ATTENTION_BACKEND = re.compile(r"^--(?:[a-z0-9]+-)*attention-backend$")


# -- values ----------------------------------------------------------------------------


def _normal(value, depth: int = 0):
    """JSON-able, with whole numbers as integers, at most 32 levels deep."""
    if depth > 32:
        return "..."
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return _number(value)
    if isinstance(value, dict):
        return {str(k): _normal(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normal(v, depth + 1) for v in value]
    return str(value)


def _number(value):
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value.is_integer() and abs(value) < 2**53:
            return int(value)
    return value


def canonical(value) -> str:
    """The value's identity: a short text of its type and value, JSON with sorted keys for
    containers, a sha256 in place of a long one."""
    kind = type(value)
    if kind is str:
        if len(value) <= MAX_KEY:
            return "s" + value
        value = ["s", value]  # hashed below, apart from a list holding the same text
    elif kind is int or kind is float:
        return f"n{_number(value)!r}"
    elif kind is bool or value is None:
        return f"c{value}"
    try:
        text = json.dumps(_normal(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = json.dumps(str(type(value).__name__))
    if len(text) <= MAX_KEY:
        return text
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def shown(value) -> str:
    """A value as a message shows it: text as it is, anything else as JSON; cut to a bound."""
    if value == ABSENT:
        return "absent"
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(_normal(value), sort_keys=True, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError):
            text = type(value).__name__
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def _summary_value(value):
    """A value for report.json's a/b: itself when small, else its shown text."""
    normal = _normal(value)
    try:
        small = len(json.dumps(normal, ensure_ascii=False)) <= 2 * MAX_SHOWN
    except (TypeError, ValueError, RecursionError):
        small = False
    return normal if small else shown(value)


@dataclass
class Seen:
    """The distinct values a field takes in one run (a bounded number of them)."""

    values: dict[str, object] = field(default_factory=dict)  # canonical key -> first value
    more: bool = False  # more distinct values than MAX_DISTINCT: compared by the first ones

    def add(self, value) -> None:
        key = canonical(value)
        if key in self.values:
            return
        if len(self.values) >= MAX_DISTINCT:
            self.more = True
            return
        self.values[key] = value

    @property
    def keys(self) -> frozenset:
        return frozenset(self.values) | ({"(more)"} if self.more else frozenset())

    def text(self) -> str:
        items = sorted(shown(v) for v in self.values.values())
        head = ", ".join(items[:4])
        rest = len(items) - 4 + (1 if self.more else 0)
        return head + (f" and {rest} more" if rest > 0 else "")

    def summary(self):
        items = [self.values[k] for k in sorted(self.values)]
        if len(items) == 1 and not self.more:
            return _summary_value(items[0])
        listed = [_summary_value(v) for v in items[:MAX_SUMMARY_VALUES]]
        if len(items) > MAX_SUMMARY_VALUES or self.more:
            listed.append(f"... ({len(items)}{'+' if self.more else ''} values)")
        return listed


def package_set(record) -> dict | None:
    """A runtime's installed packages as {sha256, versions_sha256, count, hashes}: two runs
    compare package sets without carrying the lists. A package is `name: version`
    (runtime_check's record, which the levels carry) or `name: {version, sha256}` (the study
    lock's runtime). `sha256` digests every `name==version` with the package's sha256 where
    known, `versions_sha256` the same without them, so that a set recorded with hashes still
    compares with one recorded without (check()); `hashes` counts the packages with one.
    SGLang itself is left out (its release or commit is a field of its own), and so is pip's
    own tooling; names are normalised as PEP 503 says. None when the record has no package
    list."""
    packages = record.get("packages") if isinstance(record, dict) else record
    if not isinstance(packages, dict) or not packages:
        return None
    plain, hashed = [], []
    for name, entry in itertools.islice(packages.items(), MAX_PACKAGES):
        name = _SEPARATORS.sub("-", str(name)[:MAX_NAME]).lower()
        if name == "sglang" or name in NOT_FROZEN:
            continue
        version, digest = (
            (entry.get("version"), entry.get("sha256"))
            if isinstance(entry, dict)
            else (entry, None)
        )
        line = f"{name}=={str(version)[:MAX_NAME]}"
        plain.append(line)
        known = isinstance(digest, str) and _SHA256.match(digest.lower())
        hashed.append(f"{line} sha256:{digest.lower()}" if known else line)
    return {
        "sha256": _lines_digest(hashed),
        "versions_sha256": _lines_digest(plain),
        "count": len(plain),
        "hashes": sum(a != b for a, b in zip(hashed, plain, strict=True)),
    }


def _lines_digest(lines: list[str]) -> str:
    text = "\n".join(sorted(lines))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# -- one run's facts ---------------------------------------------------------------------


@dataclass
class Facts:
    fields: dict[str, Seen] = field(default_factory=dict)
    # config -> {launch fingerprint: {flag or variable: value}}, each distinct launch once
    argv: dict[str, dict] = field(default_factory=dict)
    environment: dict[str, dict] = field(default_factory=dict)
    # GPU models or the explicit profile: whether the hardware differs (for gpu.count)
    hardware: Seen = field(default_factory=Seen)

    def add(self, name: str, value) -> None:
        """Adds a known value; None is unknown and adds nothing."""
        if value is not None:
            self.fields.setdefault(name, Seen()).add(value)


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _name(value) -> str:
    return str(value)[:MAX_NAME]


def facts(results) -> Facts:
    """What one run (analysis.results.Results) records of every compared field."""
    found = Facts()
    run = _dict(getattr(results, "run", None))
    from_levels: set[str] = set()
    for level in results.levels:
        settings = _dict(level.settings)
        for name in SETTINGS:
            # A workload's max_new_tokens is its osl: compared with its workload.
            if name in RUN_FIRST or (name == "max_new_tokens" and level.workload is not None):
                continue
            if settings.get(name) is not None:
                found.add(f"settings.{name}", settings[name])
                from_levels.add(name)
        _level_facts(found, level)
    for name in SETTINGS:
        if name in from_levels:
            continue
        if name == "repeats" and run.get(name) is None:
            for level in results.levels:
                found.add("settings.repeats", level.repeats)
        else:
            found.add(f"settings.{name}", run.get(name))
    model = _dict(run.get("model"))
    if model:
        target = _dict(model.get("target"))
        found.add("model", {"name": model.get("name"), "target": target.get("repo_id")})
        found.add("model.accuracy_floors", model.get("accuracy_floors"))
    recorded = set(found.fields)
    for name, value in lock_values(run.get("lock")):
        if name.startswith("gpu.") and name in recorded:
            # The lock's platform is where its runtime was recorded, maybe months and
            # machines ago; the levels say where this run ran.
            continue
        if name.startswith("runtime.packages.") and name in recorded:
            _take_locked_hashes(found.fields[name], value)
        found.add(name, value)
    return found


def _take_locked_hashes(seen: Seen, locked) -> None:
    """The levels' package sets carry versions only; one with the lock's versions is the
    lock's set, hashes included, so that a run whose hosts ran what it locked has one value
    and runs of two locks compare by hashes too."""
    if not isinstance(locked, dict):
        return
    for key, value in list(seen.values.items()):
        if (
            isinstance(value, dict)
            and not value.get("hashes")
            and value.get("versions_sha256") == locked.get("versions_sha256")
        ):
            del seen.values[key]


def _level_facts(found: Facts, level) -> None:
    p = _dict(level.provenance)
    name = _name(level.prompt_set)
    if level.workload is not None:
        found.add(f"prompts[{name}].workload", level.workload)
    found.add(f"prompts[{name}].sha256", _dict(p.get("prompts")).get("sha256"))
    found.add(f"prompts[{name}].chat_template_kwargs", p.get("chat_template_kwargs"))
    repos = {}
    for entry in p.get("weights") if isinstance(p.get("weights"), list) else []:
        entry = _dict(entry)
        repo = entry.get("repo_id")
        if isinstance(repo, str) and repo:
            found.add(f"weights[{_name(repo)}].revision", entry.get("revision"))
            repos.setdefault(str(entry.get("role")), _name(repo))
    launch = _dict(p.get("launch"))
    runtime = _dict(p.get("runtime"))
    kind = launch.get("runtime")
    packages = _dict(runtime.get("packages"))
    if kind == "git":
        git = _dict(runtime.get("git"))
        found.add("runtime.git.commit", git.get("commit"))
        found.add("runtime.git.patches", git.get("patches"))
        found.add("runtime.packages.git", packages.get("git"))
    else:
        # The runtime record's release, else what the server says it runs.
        found.add("runtime.release", runtime.get("release") or p.get("sglang_version"))
        found.add("runtime.packages.release", packages.get("release"))
    gpu = _dict(p.get("gpu"))
    models = gpu.get("models")
    count = gpu.get("count")
    if isinstance(models, dict):
        names = sorted(_name(m) for m in models)
        found.add("gpu.models", names)
        found.hardware.add(names)
        if count is None and all(type(n) is int for n in models.values()):
            count = sum(models.values())
    else:
        found.add("gpu.models", models)
    found.add("gpu.count", count)
    for fact in ("interconnect", "driver_version", "cuda_version"):
        found.add(f"gpu.{fact}", gpu.get(fact))
    found.add("gpu.profile", p.get("profile"))
    if p.get("profile") is not None:
        found.hardware.add(p.get("profile"))
    if launch:
        config = _name(level.config)
        argv = launch.get("argv")
        key = (
            tuple(str(a)[:MAX_ARG] for a in argv[:MAX_ARGS])
            if isinstance(argv, list)
            else canonical(argv),
            kind if isinstance(kind, str) else canonical(kind),
            tuple(sorted(repos.items())),
        )
        seen = found.argv.setdefault(config, {})
        if key not in seen and len(seen) < MAX_DISTINCT:
            seen[key] = launch_flags(argv, kind, repos)
        environment = launch.get("environment")
        if isinstance(environment, dict):
            environment = {k: v for k, v in environment.items() if k not in IGNORED_ENVIRONMENT}
        key = canonical(environment)
        seen = found.environment.setdefault(config, {})
        if key not in seen and len(seen) < MAX_DISTINCT:
            seen[key] = launch_environment(environment)


def launch_flags(argv, kind=None, repos: dict | None = None) -> dict[str, object]:
    """A launch argv as {flag: value}: the program before the first flag left out (the
    runtime is compared on its own), --flag=value split, a flag's values joined by spaces,
    several occurrences of one flag as their sorted list (order never matters), the server's
    address left out, model paths shown as the weights' repository, secrets masked. The
    launch record's runtime (release or git) rides along as `(runtime)`."""
    repos = repos or {}
    if not isinstance(argv, list):
        return {"(argv)": shown(argv)} if argv is not None else {}
    items = [str(a)[:MAX_ARG] for a in argv[:MAX_ARGS]]
    occurrences: dict[str, list[str]] = {}
    flag = None
    values: list[str] = []

    def close():
        if flag is not None:
            occurrences.setdefault(flag, []).append(" ".join(values) or SET)

    for item in items:
        if item.startswith("--"):
            close()
            flag, _, value = item.partition("=")
            values = [value] if "=" in item else []
        elif flag is not None:
            values.append(item)
    close()
    found: dict[str, object] = {}
    for name, given in occurrences.items():
        if name in IGNORED_FLAGS:
            continue
        if name in SECRET_FLAGS:
            given = [MASK if v != SET else v for v in given]
        elif name in WEIGHT_FLAGS:
            given = [repos.get(WEIGHT_FLAGS[name], "(a local path)") for _ in given]
        found[name] = given[0] if len(given) == 1 else sorted(given)
    if kind is not None:
        found["(runtime)"] = kind if isinstance(kind, str) else shown(kind)
    return found


def launch_environment(environment) -> dict[str, object]:
    """The launch's environment, secret-looking names masked (as the kit records them)."""
    if not isinstance(environment, dict):
        return {"(environment)": shown(environment)} if environment is not None else {}
    found = {}
    for name, value in itertools.islice(environment.items(), MAX_ARGS):
        name = _name(name)
        secret = is_secret_name(name)
        found[name] = MASK if secret and value not in (None, "") else value
    return found


def lock_values(lock) -> list[tuple[str, object]]:
    """Field values a study lock (run.json `lock`: the lock file's content, LOCK.md) records
    for its run:

        weights:  {<repo_id>: {revision}}            -> weights[<repo_id>].revision
        datasets: {<repo_id>: {revision}}            -> datasets[<repo_id>].revision
        git:      {sglang: {commit}}                 -> runtime.git.commit (the SGLang source
                                                        the git runtime is built from)
                  {<other>: {commit}}                -> git[<other>].commit
        runtime:  {release|git: {packages: {name: {version, sha256}}, or older {name:
                  version}, or {packages_sha256}}}   -> runtime.packages.<kind>
                  {release|git: {python}}            -> runtime.python.<kind>
                  {release|git: {platform: {driver, driver_cuda}}}
                                                     -> gpu.driver_version, gpu.cuda_version
                                                        (only where no level records them)

    They join the levels' own values: a run whose lock and levels agree has one value."""
    lock = _dict(lock)
    found: list[tuple[str, object]] = []
    for section in ("weights", "datasets"):
        for repo, entry in itertools.islice(_dict(lock.get(section)).items(), 64):
            found.append((f"{section}[{_name(repo)}].revision", _dict(entry).get("revision")))
    for kind, entry in _dict(lock.get("runtime")).items():
        if kind not in ("release", "git"):
            continue
        entry = _dict(entry)
        digest = package_set(entry) or (
            {"sha256": entry["packages_sha256"], "count": entry.get("count")}
            if isinstance(entry.get("packages_sha256"), str)
            else None
        )
        found.append((f"runtime.packages.{kind}", digest))
        found.append((f"runtime.python.{kind}", entry.get("python")))
        platform = _dict(entry.get("platform"))
        found.append(("gpu.driver_version", platform.get("driver")))
        found.append(("gpu.cuda_version", platform.get("driver_cuda")))
    for name, entry in itertools.islice(_dict(lock.get("git")).items(), 8):
        field_name = "runtime.git.commit" if name == "sglang" else f"git[{_name(name)}].commit"
        found.append((field_name, _dict(entry).get("commit")))
    return [(name, value) for name, value in found if value is not None]


# -- two runs ------------------------------------------------------------------------------


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
            digests = _dict(value)
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
