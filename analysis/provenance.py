"""What the report reads of a level's provenance: the reduced record it keeps, and the TP
size, DDTree budget and verify width a level was served at (from the launch, else the config's
name)."""

from __future__ import annotations

import itertools

from ansible.module_utils.contract.launch import TP_FLAGS, flag_value
from ansible.module_utils.contract.names import MAX_TP
from ansible.module_utils.contract.names import read_config_name as parse_config_name

from analysis.comparability import package_set
from analysis.results_values import finite

# -- what a level was served at --------------------------------------------------------

# Expanded serving config names are the writer's (module_utils/contract/names.py): <config>,
# <config>-tp<N>, <config>-b<B>, <config>-tp<N>-b<B>. The analysis reads them leniently
# (parse_config_name here is contract.names.read_config_name): a name it cannot read, or with
# a TP size or budget the kit cannot render, stays whole. analysis/results.py hands it on, with
# CHAIN_CONTROL, base_config and config_order from the same module.

# Flag values read from a launch argv are counts of tokens: anything past this is not one.
MAX_COUNT = 1_000_000


def _tp(text: str | None) -> int | None:
    value = _count(text)
    return value if value is not None and value <= MAX_TP else None


def tp_size(config: str, provenance: dict | None = None) -> int | None:
    """The tensor-parallel size a level was served at: the launch argv's --tp-size (or its
    aliases), else the config name's -tp<N>, else None (unknown)."""
    argv = _argv(provenance)
    for flag in TP_FLAGS:
        value = _tp(flag_value(argv, flag))
        if value is not None:
            return value
    return parse_config_name(config)[1]


def _count(text: str | None) -> int | None:
    # isdecimal, not isdigit: int() refuses "²", a digit to isdigit.
    if text is None or not text.isdecimal() or len(text) > 7:
        return None
    value = int(text)
    return value if 0 < value <= MAX_COUNT else None


def _argv(provenance: dict | None):
    launch = (provenance or {}).get("launch") or {}
    return launch.get("argv") if isinstance(launch, dict) else None


def ddtree_budget(config: str, provenance: dict | None = None) -> int | None:
    """The DDTree node budget: the launch record's, else the argv's
    --speculative-ddtree-budget under --speculative-algorithm DDTREE, else the name's
    (ddtree-b<N>, ddtree-tp<T>-b<N>)."""
    launch = (provenance or {}).get("launch") or {}
    if isinstance(launch.get("budget"), int) and not isinstance(launch.get("budget"), bool):
        return launch["budget"]
    argv = _argv(provenance)
    if (flag_value(argv, "--speculative-algorithm") or "").upper() == "DDTREE":
        budget = _count(flag_value(argv, "--speculative-ddtree-budget"))
        if budget is not None:
            return budget
    return parse_config_name(config)[2]


def verify_tokens_per_step(config: str, provenance: dict | None = None) -> int | None:
    """Tokens the target verifies per step: budget + 1 for DDTree (the pull request sizes its
    verify CUDA graphs so), the draft token count for a chain (--speculative-num-draft-tokens,
    else the DFlash block size), 1 without speculation; None when the launch argv does not
    say."""
    budget = ddtree_budget(config, provenance)
    if budget is not None:
        return budget + 1
    argv = _argv(provenance)
    if not isinstance(argv, list) or not argv:
        return None
    algorithm = flag_value(argv, "--speculative-algorithm")
    if algorithm is None or algorithm.upper() == "NONE":
        return 1
    # A DDTREE launch without a budget defaults to draft tokens - 1 nodes: draft tokens verified.
    return _count(flag_value(argv, "--speculative-num-draft-tokens")) or _count(
        flag_value(argv, "--speculative-dflash-block-size")
    )


# -- the reduced record ----------------------------------------------------------------


def reduce_provenance(provenance: dict) -> dict:
    """The parts of a level's provenance the report shows (the rest stays in the files)."""

    def pick(value, *names):
        return {n: value.get(n) for n in names} if isinstance(value, dict) else None

    launch = provenance.get("launch") if isinstance(provenance.get("launch"), dict) else {}
    runtime = provenance.get("runtime") if isinstance(provenance.get("runtime"), dict) else {}
    git = runtime.get("git") if isinstance(runtime.get("git"), dict) else None
    release = runtime.get("release") if isinstance(runtime.get("release"), dict) else None
    weights = provenance.get("weights") if isinstance(provenance.get("weights"), list) else []
    # The benchmark role records every prompt set by name; this level's is `prompts.name`.
    sets = provenance.get("prompt_sets")
    prompt_set = sets.get(provenance["prompts"]["name"]) if isinstance(sets, dict) else None
    return {
        "host": provenance.get("host"),
        "profile": provenance.get("profile"),
        "kit_version": provenance.get("kit_version"),
        "sglang_version": provenance.get("sglang_version"),
        "gpu": pick(
            provenance.get("gpu"),
            "count",
            "models",
            "driver_version",
            "cuda_version",
            "interconnect",
        ),
        "runtime": {
            "release": release.get("version") if release else None,
            "git": pick(git, "url", "ref", "commit", "patches") if git else None,
            # Each runtime's installed packages as a digest, for compare's comparability.
            "packages": {"release": package_set(release), "git": package_set(git)},
        },
        "launch": pick(launch, "config", "base", "budget", "runtime", "argv", "environment"),
        "weights": [pick(w, "role", "repo_id", "revision", "manifest_sha256") for w in weights[:4]],
        "prompts": pick(provenance.get("prompts"), "name", "sha256", "requests_per_level"),
        "prompt_source": prompt_set.get("source") if isinstance(prompt_set, dict) else None,
        # The chat template switches the set was rendered with (thinking off for scored sets).
        "chat_template_kwargs": _template_kwargs(prompt_set),
        "started_at": provenance.get("started_at"),
        "ended_at": provenance.get("ended_at"),
        # The host records the speed model reads where the benchmark role named them (the
        # tuning stage's all-reduce check, the host's speed calibration): bounded copies,
        # every field checked where it is used (analysis/predicted.py).
        "allreduce": _bounded(provenance.get("allreduce")),
        "speed_calibration": _bounded(provenance.get("speed_calibration")),
    }


# A host record kept for the speed model: a few levels deep, a few hundred items, short
# texts. The tuning stage's all-reduce record has a row per message size (about 16), a
# calibration record a row per token count (about 10): anything far larger is not one.
_RECORD_DEPTH = 4
_RECORD_ITEMS = 256
_RECORD_TEXT = 200


def _bounded(value, depth: int = _RECORD_DEPTH):
    """value as JSON with at most _RECORD_DEPTH levels, _RECORD_ITEMS items a list or object
    and _RECORD_TEXT characters a string; what lies deeper, and numbers that are not finite,
    become None."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value if finite(value) else None
    if isinstance(value, str):
        return value[:_RECORD_TEXT]
    if depth <= 0:
        return None
    if isinstance(value, list):
        return [_bounded(item, depth - 1) for item in value[:_RECORD_ITEMS]]
    if isinstance(value, dict):
        return {
            str(key)[:64]: _bounded(item, depth - 1)
            for key, item in itertools.islice(value.items(), _RECORD_ITEMS)
        }
    return None


def _template_kwargs(prompt_set) -> dict | None:
    template = prompt_set.get("chat_template") if isinstance(prompt_set, dict) else None
    kwargs = template.get("kwargs") if isinstance(template, dict) else None
    if not isinstance(kwargs, dict):
        return None
    # Shown in messages: a few short scalar switches, nothing else.
    return {
        str(k)[:64]: v
        for k, v in list(kwargs.items())[:16]
        if isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= 64)
    }
