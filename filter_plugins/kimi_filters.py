"""Filters of the kit: quoting for the files the server role writes (systemd unit, environment
file), and what several roles work out alike (the repositories the serving configs need, the
URL the server answers on).

Jinja cannot quote safely for systemd: ExecStart= splits on whitespace, expands $VAR and
%-specifiers; an EnvironmentFile value needs double quotes and escapes. These do it once.

Serving config names (<config>, <config>-tp<N>, ddtree-b<B>, ddtree-tp<N>-b<B>) are read by
module_utils/plan/serving.py alone; the name filters here call it, so no role parses them with a
regular expression of its own.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import ipaddress
import os
import re
import sys
from pathlib import Path

from ansible.errors import AnsibleFilterError


def _kit_module_utils() -> None:
    """Modules get the kit's module_utils/ shipped with them; a filter runs in ansible-playbook,
    where the kit's folder is not on sys.path: load module_utils/__init__.py by path once, which
    makes ansible.module_utils.<stage> importable (its finder), as for the analysis and tests."""
    if "module_utils" in sys.modules:
        return
    init = Path(__file__).resolve().parents[1] / "module_utils" / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        "module_utils", init, submodule_search_locations=[str(init.parent)]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules["module_utils"] = package
    spec.loader.exec_module(package)


_kit_module_utils()

import yaml  # noqa: E402
from ansible.module_utils.canary.serve import CanaryError, launches, source_files  # noqa: E402
from ansible.module_utils.contract.names import ServingConfigError, parse_config_name  # noqa: E402
from ansible.module_utils.host.rollout import RolloutError, rollout  # noqa: E402
from ansible.module_utils.host.secret_scrub import Scrubber  # noqa: E402
from ansible.module_utils.plan.capacity_launches import capacity_launches  # noqa: E402
from ansible.module_utils.plan.download import download_time, duration_words  # noqa: E402
from ansible.module_utils.plan.model_data import (  # noqa: E402
    MAX_MODEL_FILE_BYTES,
    ModelDataError,
    config_paths,
    load_model,
    serving_definitions,
)
from ansible.module_utils.plan.said_once import said_once  # noqa: E402
from ansible.module_utils.plan.serving import ddtree_rules, ordered_run  # noqa: E402
from ansible.module_utils.plan.speed_inputs import SpeedModelError  # noqa: E402
from ansible.module_utils.plan.speed_plan import (  # noqa: E402
    hardware_figures,
    plan_inputs,
    plan_speed,
    read_record,
)
from ansible.module_utils.router.fleet import (  # noqa: E402
    FleetError,
    benchmark_targets,
    fleets,
    local_url,
)
from ansible.module_utils.weights.folders import weights_folders  # noqa: E402

DOCUMENTATION = r"""
name: kimi_filters
short_description: The kit's filters (quoting for systemd, serving config names, model folders)
description:
  - C(systemd_exec_line) turns an argv list into the value of ExecStart=.
  - C(env_file_line) turns a key and a value into one EnvironmentFile line.
  - C(kimi_canary_launches) turns serving_render's configs into the canary's launches, secrets
    apart.
  - C(kimi_small_files) cuts hub_repo_info's file lists to the small files the canary fetches;
    C(kimi_weights_folders) is the weights stage's folders as server_files entries.
  - C(kimi_needed_repos) lists the kimi_repos keys the selected serving configs need, C(target)
    first, then each drafter once (preflight, weights and plan ask for the same ones).
  - C(kimi_server_url) is the URL on the server's host that reaches the server described by
    kimi_server_settings (loopback when it listens on every address; IPv6 in brackets).
  - C(kimi_config_base) is the serving config an expanded name belongs to (ddtree-tp4-b32:
    ddtree); C(kimi_config_name_parts) gives {base, tp, budget} of a name.
  - C(kimi_expanded_configs) is the benchmark's run list: the selected configs over their TP
    sizes and DDTree budgets, each control before what it controls, the reference first.
  - C(kimi_model_data) loads models/<name>/model.yml, checked field by field
    (module_utils/plan/model_data.py; a bad field fails naming the file, field and fix).
    C(kimi_serving_definitions) gives the model's serving configs with DDTree budgets and TP
    sizes; C(kimi_model_configs) the shipped config.json of the target and each drafter.
  - C(kimi_example_address) tells a documentation address or name (192.0.2.0/24, 2001:db8::/32,
    example.com, ...) from a real one: the shipped inventories hold such examples.
  - C(kimi_study_requested) is what a host's settings ask the study lock for (the needed
    repositories' revisions, the prompt sets' dataset revisions, the SGLang git source when a
    config runs on it); C(kimi_lock_pinned) gives kimi_repos, prompt set definitions or the git
    source with the lock's commits in place of what they asked for.
  - C(kimi_rollout) is deploy_kimi.yml's rolling order (module_utils/host/rollout.py) from
    kimi_deploy_serial, the inventory's groups, the play's group and the hosts --limit leaves
    (hosts, serial batch sizes, batches, rolling); the hosts of a kimi_cluster_* group go in
    one batch. A bad kimi_deploy_serial fails naming the value and the fix.
  - C(kimi_scrub) masks the given secrets (in every form module_utils/host/secret_scrub.py knows)
    and secret-shaped values (an C(api_key) assignment, a bearer header) in a text or a list
    of lines, for a server log's lines that reach a result file.
  - C(kimi_ddtree_rules) says whether the study runs DDTree's SGLang at the commit the kit's
    DDTree rules (the contract overlay) were read at: drift, both commits, the files to re-read.
  - C(kimi_router_fleets) is each router host's fleet from the kimi_router_* groups
    (module_utils/router/fleet.py): its group and its replicas' URLs; a bad group fails naming it.
    C(kimi_fleet_targets) is what a fleet benchmark measures from the router host, in order.
  - C(kimi_speed_plan) is the plan's speed prediction (module_utils/plan/speed_plan.py): per
    rendered
    launch and concurrency level the predicted step time with its parts, accepted tokens per
    step and tokens/s, per DDTree config its curve over the budgets and best budget, from the
    profile's hardware figures (the host's calibration record on the controller where it is
    there). Bad hardware data fails naming what was found, what is needed and the fix.
"""

PLAIN = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _double_quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _control_free(text: str, what: str) -> str:
    """text, or ValueError naming what holds a control character: a unit file or env file reads
    one line per setting, and a carriage return or newline would start another (a setting of
    the attacker's), while other control characters have no business in them."""
    for char in text:
        if ord(char) < 32 or 127 <= ord(char) < 160:
            raise ValueError(f"{what} holds the control character {char!r}: {text!r}")
    return text


def systemd_value(value) -> str:
    """A value for the server's unit file (a path, a title), refused with a control character."""
    return _control_free(str(value), "a systemd unit value")


def systemd_exec_line(argv: list) -> str:
    words = []
    for arg in map(str, argv):
        _control_free(arg, "an argument of ExecStart=")
        word = arg if PLAIN.match(arg) else _double_quoted(arg)
        # systemd expands %-specifiers and $VARIABLES in ExecStart=; doubling keeps them literal.
        words.append(word.replace("%", "%%").replace("$", "$$"))
    return " ".join(words)


def env_file_line(key: str, value) -> str:
    key = str(key)
    if not ENV_NAME.match(key):
        raise ValueError(f"not a valid environment variable name: {key!r}")
    value = _control_free(str(value), f"the environment value of {key}")
    return f"{key}={_double_quoted(value)}"


def kimi_needed_repos(selected, definitions) -> list[str]:
    """kimi_repos keys for the selected serving configs: the target, then each drafter once."""
    if not isinstance(selected, (list, tuple)) or not isinstance(definitions, dict):
        raise AnsibleFilterError(
            f"kimi_needed_repos needs a list of config names and the definitions mapping, got "
            f"{type(selected).__name__} and {type(definitions).__name__}"
        )
    # An expanded name (ddtree-tp4-b32) needs what its config needs.
    selected = [
        name if name in definitions else _names(parse_config_name, name)[0] for name in selected
    ]
    unknown = [name for name in selected if name not in definitions]
    if unknown:
        raise AnsibleFilterError(
            f"serving configs {unknown} are not defined; defined: {sorted(definitions)} "
            "(kimi_serving_config_definitions)"
        )
    needed = ["target"]
    for name in selected:
        definition = definitions[name]
        drafter = definition.get("drafter") if isinstance(definition, dict) else None
        if drafter and drafter not in needed:
            needed.append(str(drafter))
    return needed


# The server listens on every address: reach it through loopback on its own host.
def kimi_server_url(settings) -> str:
    """http://host:port of the server kimi_server_settings describes, as its host reaches it."""
    if not isinstance(settings, dict):
        raise AnsibleFilterError(f"kimi_server_url needs kimi_server_settings, got {settings!r}")
    try:
        return local_url(settings.get("host"), settings.get("port"))
    except FleetError as error:
        raise AnsibleFilterError(str(error)) from None


def _names(function, *args):
    try:
        return function(*args)
    except ServingConfigError as error:
        raise AnsibleFilterError(str(error)) from None


def kimi_study_requested(
    repos, selected, definitions, prompt_sets, prompt_set_definitions, git
) -> dict:
    """What a host asks the study lock for (module_utils/plan/study_lock.py's `requested`). A config
    name it cannot place is left out: the stage's own checks name it with their fix."""
    if not all(isinstance(value, dict) for value in (repos, definitions, prompt_set_definitions)):
        raise AnsibleFilterError(
            "kimi_study_requested needs kimi_repos, the serving config definitions and the "
            "prompt set definitions as mappings"
        )
    known = []
    for name in selected if isinstance(selected, (list, tuple)) else []:
        try:
            if kimi_config_base(name) in definitions:
                known.append(name)
        except AnsibleFilterError:
            continue
    selected = known
    needed = [name for name in kimi_needed_repos(selected, definitions) if name in repos]
    weights = {repos[name]["repo_id"]: str(repos[name]["revision"]) for name in needed}
    datasets: dict[str, str] = {}
    asked_by: dict[str, str] = {}
    for name in prompt_sets or []:
        spec = prompt_set_definitions.get(name)
        # A set from the user's own file (benchmark_prompt_files) has no hub repository.
        if isinstance(spec, dict) and spec.get("repo") and spec.get("revision"):
            repo, revision = str(spec["repo"]), str(spec["revision"])
            if datasets.setdefault(repo, revision) != revision:
                raise AnsibleFilterError(
                    f"prompt sets {asked_by[repo]} and {name} ask {repo} at two revisions "
                    f"({datasets[repo]} and {revision}); the study lock pins one commit a "
                    "repository. Fix: give both the same revision in "
                    "kimi_prompt_set_definitions"
                )
            asked_by.setdefault(repo, name)
    bases = {kimi_config_base(name) for name in selected}
    on_git = any(
        isinstance(definitions.get(base), dict) and definitions[base].get("runtime") == "git"
        for base in bases
    )
    requested = {"weights": weights, "datasets": datasets, "git": {}}
    if on_git and isinstance(git, dict) and git.get("url") and git.get("ref"):
        requested["git"]["sglang"] = {"url": str(git["url"]), "ref": str(git["ref"])}
    return requested


def kimi_study_used(repos, revisions, runtime_git, prompt_sets) -> dict:
    """What a host's stages resolved and used, for the study lock's record: the commits of
    its repositories (weights_revisions or preflight_resolved_revisions: name -> commit), of
    the git source its runtime was built from (kimi_runtime_git's source stamp) and of the
    datasets its prompt sets came from (benchmark_prompts' sets[].source)."""
    used: dict = {"weights": {}, "datasets": {}, "git": {}}
    if isinstance(repos, dict) and isinstance(revisions, dict):
        for name, commit in revisions.items():
            if isinstance(repos.get(name), dict) and repos[name].get("repo_id"):
                used["weights"][str(repos[name]["repo_id"])] = commit
    source = runtime_git.get("source") if isinstance(runtime_git, dict) else None
    if isinstance(source, dict) and source.get("commit"):
        used["git"]["sglang"] = source["commit"]
    sets = prompt_sets.get("sets") if isinstance(prompt_sets, dict) else None
    for found in (sets or {}).values():
        origin = found.get("source") if isinstance(found, dict) else None
        if isinstance(origin, dict) and origin.get("repo") and origin.get("resolved"):
            used["datasets"][str(origin["repo"])] = origin["resolved"]
    return used


def kimi_lock_pinned(value, study_lock, what: str):
    """value with the study lock's commits in place of the revisions it asks for: `repos`
    (kimi_repos: name -> {repo_id, revision}), `prompt_sets` (name -> {repo, revision, ...})
    or `git` ({url, ref, patches}: gains `commit`). The lock's play checked that it was made
    from these settings; without a lock (or an entry) the value is returned as it is."""
    pins = (study_lock or {}).get("pins") if isinstance(study_lock, dict) else None
    if not isinstance(pins, dict):
        return value
    entries = (study_lock.get("lock") or {}) if isinstance(study_lock.get("lock"), dict) else {}

    def pinned(section: str, repo, revision):
        """The lock's commit for repo when the lock was made from this revision, else it."""
        entry = (entries.get(section) or {}).get(repo) or {}
        commit = (pins.get(section) or {}).get(repo)
        fits = revision in (entry.get("requested"), entry.get("revision"))
        return commit if commit and fits else revision

    if what == "repos":
        return {
            name: {**repo, "revision": pinned("weights", repo.get("repo_id"), repo.get("revision"))}
            for name, repo in value.items()
        }
    if what == "prompt_sets":
        return {
            name: {**spec, "revision": pinned("datasets", spec.get("repo"), spec.get("revision"))}
            if isinstance(spec, dict) and spec.get("repo")
            else spec
            for name, spec in value.items()
        }
    if what == "git":
        locked = (pins.get("git") or {}).get("sglang")
        if locked and isinstance(value, dict) and locked.get("url") == value.get("url"):
            return {**value, "commit": locked["commit"]}
        return value
    raise AnsibleFilterError(f"kimi_lock_pinned: what is {what!r}; one of repos, prompt_sets, git")


# Addresses and names reserved for documentation (RFC 5737, RFC 3849, RFC 2606): what the
# shipped inventories hold until a user puts their own hosts there.
_DOC_NETWORKS = tuple(
    ipaddress.ip_network(net)
    for net in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
)


def kimi_example_address(address) -> bool:
    """Whether an inventory address is a documentation one (never a real host); given a pair
    (ansible_host, inventory name), whether either is."""
    if isinstance(address, (list, tuple)):
        return any(kimi_example_address(item) for item in address)
    text = str(address or "").strip().strip("[]").lower().rstrip(".")
    try:
        return any(ipaddress.ip_address(text) in net for net in _DOC_NETWORKS)
    except ValueError:
        return text in ("example.com", "example.net", "example.org", "example") or text.endswith(
            (".example", ".example.com", ".example.net", ".example.org")
        )


def kimi_config_base(name) -> str:
    """The serving config an expanded name belongs to: ddtree-tp4-b32 -> ddtree."""
    return _names(parse_config_name, name)[0]


def kimi_config_name_parts(name) -> dict:
    """{base, tp, budget} of an expanded name (tp and budget None where the name has none)."""
    base, tp, budget = _names(parse_config_name, name)
    return {"base": base, "tp": tp, "budget": budget}


def kimi_expanded_configs(definitions, selected, reference=None, budgets=None) -> list[str]:
    """The ordered run list of `selected` (module_utils/plan/serving.py ordered_run)."""
    if not isinstance(definitions, dict) or not isinstance(selected, (list, tuple)):
        raise AnsibleFilterError(
            "kimi_expanded_configs needs the definitions mapping and a list of config names, got "
            f"{type(definitions).__name__} and {type(selected).__name__}"
        )
    return _names(ordered_run, definitions, list(selected), reference, budgets)


def _model(function, *args):
    try:
        return function(*args)
    except ModelDataError as error:
        raise AnsibleFilterError(str(error)) from None


# Every variable group_vars/all derives from the model is templated again wherever it is used
# (a hundred times and more in one plan run), so the checked data is kept per file content: a
# model.yml changed on disk is read and checked again.
_MODELS: dict[tuple, dict] = {}
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _parse_yaml(text: str):
    return yaml.load(text, Loader=_YAML_LOADER)  # noqa: S506 - a safe loader, C or Python


def kimi_model_data(name, models_dir):
    try:
        path = os.path.join(str(models_dir), str(name), "model.yml")
        with open(path, "rb") as handle:
            digest = hashlib.sha256(handle.read(MAX_MODEL_FILE_BYTES + 1)).hexdigest()
        key = (str(models_dir), str(name), digest)
    except (OSError, ValueError):
        key = None  # load_model names what is wrong
    if key is None or key not in _MODELS:
        data = _model(load_model, str(models_dir), name, _parse_yaml)
        if key is None:
            return data
        if len(_MODELS) >= 16:
            _MODELS.clear()
        _MODELS[key] = data
    return copy.deepcopy(_MODELS[key])


def kimi_serving_definitions(model, budgets, tp_sizes=None):
    return _model(serving_definitions, model, budgets, tp_sizes)


def kimi_model_configs(model, models_dir):
    return _model(config_paths, model, str(models_dir))


def kimi_rollout(groups, serial, play_group, present) -> dict:
    try:
        return rollout(serial, groups, play_group, present)
    except RolloutError as error:
        raise AnsibleFilterError(str(error)) from None


def kimi_small_files(hub, max_bytes) -> dict:
    """hub_repo_info's result with each repository's files cut to its small ones (no weights,
    none over max_bytes: module_utils/canary/serve.py source_files), total_bytes to match: the
    canary's sources, fetched by the weights stage's own transfer."""
    if not isinstance(hub, dict) or not isinstance(hub.get("repos"), dict):
        raise AnsibleFilterError("kimi_small_files needs hub_repo_info's result")
    try:
        limit = int(max_bytes)
        repos = {}
        for name, repo in hub["repos"].items():
            files = source_files(repo.get("files") or [], limit)
            repos[name] = {**repo, "files": files, "total_bytes": sum(f["size"] for f in files)}
    except (CanaryError, TypeError, ValueError) as error:
        raise AnsibleFilterError(f"kimi_small_files: {error}") from None
    return {**hub, "repos": repos}


def kimi_weights_folders(hub, needed, weights_dir, state_dir, service_group) -> list[dict]:
    try:
        return weights_folders(hub.get("repos"), needed, weights_dir, state_dir, service_group)
    except (AttributeError, ValueError) as error:
        raise AnsibleFilterError(f"kimi_weights_folders: {error}") from None


def kimi_canary_launches(configs, extra) -> dict:
    """serving_render's unmasked configs as canary launches, secrets apart
    (module_utils/canary/serve.py launches)."""
    try:
        return launches(configs, extra)
    except (CanaryError, KeyError, TypeError) as error:
        raise AnsibleFilterError(f"kimi_canary_launches: {error}") from None


def kimi_capacity_launches(configs, definitions, model_configs) -> list[dict]:
    """capacity_plan's launches for rendered serving configs (module_utils/plan/capacity.py)."""
    try:
        return capacity_launches(configs, definitions, model_configs)
    except (KeyError, TypeError, AttributeError) as error:
        raise AnsibleFilterError(
            f"kimi_capacity_launches: a serving config, its definition or its drafter's "
            f"config is missing or malformed ({type(error).__name__}: {error})"
        ) from None


def kimi_scrub(text, secrets):
    """A server log's text or lines with secrets masked: SGLang logs its API key at start."""
    scrub = Scrubber([s for s in secrets or [] if isinstance(s, str)])
    if isinstance(text, str):
        return scrub(text)
    return [scrub(str(line)) for line in text or []]


# The overlay is the kit's own file: read bounded, as every file a filter opens.
MAX_OVERLAY_BYTES = 1 << 20


def kimi_ddtree_rules(overlay_path, locked, git) -> dict:
    """module_utils/plan/serving.py ddtree_rules() for the overlay file at overlay_path: whether the
    study runs DDTree's SGLang at the commit the kit's rules were read at."""
    try:
        with open(str(overlay_path), "rb") as handle:
            data = handle.read(MAX_OVERLAY_BYTES + 1)
        if len(data) > MAX_OVERLAY_BYTES:
            raise ValueError(f"larger than {MAX_OVERLAY_BYTES} bytes")
        overlay = yaml.safe_load(data)
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise AnsibleFilterError(
            f"kimi_ddtree_rules: cannot read the DDTree overlay {overlay_path}: {error}. Fix: "
            "run from a whole checkout of the kit (tests/contract/ holds it)."
        ) from None
    return ddtree_rules(overlay, locked, git)


def kimi_speed_plan(
    launches,
    capacities,
    model_configs,
    model_dir,
    hardware,
    profile,
    concurrency,
    prompt_sets,
    context_tokens,
    calibration_file=None,
    kv_cache_dtype="auto",
    allreduce_note=None,
    sources=None,
) -> dict:
    """module_utils/plan/speed_plan.py plan_speed() for serving_render's launches: `capacities`
    maps a launch name to its capacity plan's max_running_requests; `calibration_file` is the
    host's calibration record on the controller, used where it exists; `allreduce_note` says
    why the all-reduce figure is the profile's nominal one."""
    if not isinstance(launches, (list, tuple)) or not isinstance(capacities, dict):
        raise AnsibleFilterError(
            "kimi_speed_plan needs serving_render's launches (a list) and a mapping of launch "
            f"name to max_running_requests, got {type(launches).__name__} and "
            f"{type(capacities).__name__}"
        )
    try:
        record = read_record(calibration_file, "the host's calibration record")
        figures = hardware_figures(
            hardware, profile, record, f"this host's calibration record {calibration_file}"
        )
        inputs = plan_inputs(model_configs, model_dir)
        merged = [
            {**launch, "max_running_requests": capacities.get(launch.get("name"))}
            if isinstance(launch, dict)
            else launch
            for launch in launches
        ]
        return plan_speed(
            merged,
            inputs,
            figures,
            concurrency=concurrency,
            prompt_sets=prompt_sets,
            context_tokens=context_tokens,
            kv_cache_dtype=kv_cache_dtype,
            allreduce_source=allreduce_note,
            sources=sources,
        )
    except SpeedModelError as error:
        raise AnsibleFilterError(f"kimi_speed_plan: {error}") from None


def kimi_download_time(gbps, total_bytes) -> dict:
    """plan.json's download_time entry (module_utils/plan/download.py)."""
    try:
        return download_time(gbps, total_bytes)
    except ValueError as error:
        raise AnsibleFilterError(f"kimi_download_time: {error}") from None


def kimi_duration_words(seconds) -> str:
    return duration_words(seconds)


def kimi_said_once(entries, text_key: str, name_key: str = "name") -> list[str]:
    """One 'name, name: text' line per distinct warning (module_utils/plan/said_once.py)."""
    try:
        return said_once(entries, text_key, name_key)
    except ValueError as error:
        raise AnsibleFilterError(f"kimi_said_once: {error}") from None


def kimi_router_fleets(groups: dict, hostvars, defaults: dict | None = None) -> dict:
    try:
        return fleets(groups, hostvars, defaults)
    except FleetError as error:
        raise AnsibleFilterError(f"kimi_router_fleets: {error}") from None


def kimi_fleet_targets(fleet: dict, concurrency: list, rates: list = ()) -> list[dict]:
    try:
        return benchmark_targets(fleet, concurrency, rates)
    except (FleetError, KeyError, TypeError, ValueError) as error:
        raise AnsibleFilterError(f"kimi_fleet_targets: {error}") from None


class FilterModule:
    def filters(self):
        return {
            "systemd_exec_line": systemd_exec_line,
            "systemd_value": systemd_value,
            "env_file_line": env_file_line,
            "kimi_needed_repos": kimi_needed_repos,
            "kimi_server_url": kimi_server_url,
            "kimi_config_base": kimi_config_base,
            "kimi_config_name_parts": kimi_config_name_parts,
            "kimi_expanded_configs": kimi_expanded_configs,
            "kimi_model_data": kimi_model_data,
            "kimi_serving_definitions": kimi_serving_definitions,
            "kimi_model_configs": kimi_model_configs,
            "kimi_study_requested": kimi_study_requested,
            "kimi_lock_pinned": kimi_lock_pinned,
            "kimi_study_used": kimi_study_used,
            "kimi_example_address": kimi_example_address,
            "kimi_rollout": kimi_rollout,
            "kimi_scrub": kimi_scrub,
            "kimi_ddtree_rules": kimi_ddtree_rules,
            "kimi_small_files": kimi_small_files,
            "kimi_weights_folders": kimi_weights_folders,
            "kimi_canary_launches": kimi_canary_launches,
            "kimi_capacity_launches": kimi_capacity_launches,
            "kimi_speed_plan": kimi_speed_plan,
            "kimi_download_time": kimi_download_time,
            "kimi_duration_words": kimi_duration_words,
            "kimi_said_once": kimi_said_once,
            "kimi_router_fleets": kimi_router_fleets,
            "kimi_fleet_targets": kimi_fleet_targets,
        }
