"""What one run records of every field the comparability check compares: its level settings,
prompts, weights, runtime, launches (argv and environment, as flags and variables) and GPUs,
from its levels' provenance and run.json, joined by what its study lock records.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ansible.module_utils.contract.secrets import MASK, SECRET_FLAGS, is_secret_name

from analysis.comparability_values import (
    MAX_DISTINCT,
    MAX_NAME,
    Seen,
    as_dict,
    canonical,
    package_set,
    shown,
)

SET = "(set)"  # a flag without a value
# Bounds on a launch's argv: items read, and each item's length.
MAX_ARGS = 1000
MAX_ARG = 1000

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
# Launch flags whose values are where the server listens or a local path: the address is no
# property of the measurement, and a model folder's contents are compared as its weights'
# repository and revision (the path flags show those instead of the path).
IGNORED_FLAGS = {"--host", "--port", "--dist-init-addr"}
# The runtime version's folder the kit puts in the launch environment (so that a switch
# restarts the server): a local path, whose contents are compared as the runtime's packages.
IGNORED_ENVIRONMENT = {"KIMI_RUNTIME_DIR"}
WEIGHT_FLAGS = {"--model-path": "target", "--speculative-draft-model-path": "drafter"}


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


def _name(value) -> str:
    return str(value)[:MAX_NAME]


def facts(results) -> Facts:
    """What one run (analysis.results.Results) records of every compared field."""
    found = Facts()
    run = as_dict(getattr(results, "run", None))
    from_levels: set[str] = set()
    for level in results.levels:
        settings = as_dict(level.settings)
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
    model = as_dict(run.get("model"))
    if model:
        target = as_dict(model.get("target"))
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
    p = as_dict(level.provenance)
    name = _name(level.prompt_set)
    if level.workload is not None:
        found.add(f"prompts[{name}].workload", level.workload)
    found.add(f"prompts[{name}].sha256", as_dict(p.get("prompts")).get("sha256"))
    found.add(f"prompts[{name}].chat_template_kwargs", p.get("chat_template_kwargs"))
    repos = {}
    for entry in p.get("weights") if isinstance(p.get("weights"), list) else []:
        entry = as_dict(entry)
        repo = entry.get("repo_id")
        if isinstance(repo, str) and repo:
            found.add(f"weights[{_name(repo)}].revision", entry.get("revision"))
            repos.setdefault(str(entry.get("role")), _name(repo))
    launch = as_dict(p.get("launch"))
    runtime = as_dict(p.get("runtime"))
    kind = launch.get("runtime")
    packages = as_dict(runtime.get("packages"))
    if kind == "git":
        git = as_dict(runtime.get("git"))
        found.add("runtime.git.commit", git.get("commit"))
        found.add("runtime.git.patches", git.get("patches"))
        found.add("runtime.packages.git", packages.get("git"))
    else:
        # The runtime record's release, else what the server says it runs.
        found.add("runtime.release", runtime.get("release") or p.get("sglang_version"))
        found.add("runtime.packages.release", packages.get("release"))
    gpu = as_dict(p.get("gpu"))
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
    lock = as_dict(lock)
    found: list[tuple[str, object]] = []
    for section in ("weights", "datasets"):
        for repo, entry in itertools.islice(as_dict(lock.get(section)).items(), 64):
            found.append((f"{section}[{_name(repo)}].revision", as_dict(entry).get("revision")))
    for kind, entry in as_dict(lock.get("runtime")).items():
        if kind not in ("release", "git"):
            continue
        entry = as_dict(entry)
        digest = package_set(entry) or (
            {"sha256": entry["packages_sha256"], "count": entry.get("count")}
            if isinstance(entry.get("packages_sha256"), str)
            else None
        )
        found.append((f"runtime.packages.{kind}", digest))
        found.append((f"runtime.python.{kind}", entry.get("python")))
        platform = as_dict(entry.get("platform"))
        found.append(("gpu.driver_version", platform.get("driver")))
        found.append(("gpu.cuda_version", platform.get("driver_cuda")))
    for name, entry in itertools.islice(as_dict(lock.get("git")).items(), 8):
        field_name = "runtime.git.commit" if name == "sglang" else f"git[{_name(name)}].commit"
        found.append((field_name, as_dict(entry).get("commit")))
    return [(name, value) for name, value in found if value is not None]
