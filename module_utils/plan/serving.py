"""Serving configs rendered into a launch argv, an environment and a runtime, per host.

The one place where `python -m sglang.launch_server` flags are written: the server role and
plan.yml both call render_all(). Configs are data (group_vars/all/serving.yml); the profile
supplies attention backends, TP size and memory settings. plan.yml checks every argv against
its runtime's contract (tests/contract: the pinned release's parser, plus the DDTree pull
request's overlay for the git runtime) and records the verdict; the server role has the
installed runtime's own parser check it before a (re)start (module_utils/server/launch_check.py).

A config with `control_for: <base>` is a control that comes along whenever that base is
selected (with_controls): dflash-tree-backend, the DFlash chain on the DDTree servers' backend,
page size and scheduler, so DDTree-vs-chain differences are the tree's.

Names. A definition expands over its DDTree budgets and, with `tp: [..]`, over tensor parallel
sizes, one server each: `<config>`, `<config>-tp<N>`, `ddtree-b<B>`, `ddtree-tp<N>-b<B>`.
parse_config_name() (module_utils/contract/names.py, shared with the analysis, which reads the
same forms leniently) is the one reader of these names: the server role and the benchmark use
it through filter_plugins/kimi_filters.py.
"""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path

from ansible.module_utils.contract.disaggregation import side
from ansible.module_utils.contract.names import (  # noqa: F401  (serving's names, re-exported)
    MAX_BUDGET,
    MAX_NAME,
    MAX_TP,
    ServingConfigError,
    config_name,
    is_reference,
    parse_config_name,
    reference_at_tp,
)
from ansible.module_utils.contract.secrets import MASK, is_secret_name
from ansible.module_utils.plan.sglang_args import (
    check_argv,
    check_environment,
    contract_name,
    load_contract,
)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _split(definitions: dict, name: str) -> tuple[str, int | None, int | None]:
    """parse_config_name, except that a defined name is its own base."""
    if isinstance(name, str) and name in definitions:
        return name, None, None
    return parse_config_name(name)


def _sizes(values, what: str, low: int, high: int) -> list[int]:
    """values as a list of distinct bounded ints (strings of digits allowed: Jinja may pass
    them); anything else fails naming `what`, the value and the bounds."""
    if not isinstance(values, (list, tuple)) or len(values) > 256:
        raise ServingConfigError(f"{what} must be a list of integers, got {values!r}")
    sizes = []
    for value in values:
        if isinstance(value, bool):
            number = None
        elif isinstance(value, int):
            number = value
        elif isinstance(value, str) and value.strip().isdigit() and len(value.strip()) < 8:
            number = int(value.strip())
        else:
            number = None
        if number is None or not low <= number <= high:
            raise ServingConfigError(
                f"{what} has {value!r}; each must be an integer from {low} to {high}"
            )
        if number in sizes:
            raise ServingConfigError(f"{what} names {number} twice: {list(values)!r}")
        sizes.append(number)
    return sizes


def expansion(base: str, definition: dict) -> list[tuple[str, int | None, int | None]]:
    """(name, tp, budget) of every server one definition stands for, TP sizes outermost."""
    definition = definition or {}
    tps = definition.get("tp")
    tps = _sizes(tps, f"{base}: tp", 1, MAX_TP) if tps not in (None, []) else [None]
    budgets: list = [None]
    if definition.get("budget_flag") and definition.get("budgets"):
        budgets = _sizes(definition["budgets"], f"{base}: budgets", 1, MAX_BUDGET)
    return [(config_name(base, tp, budget), tp, budget) for tp in tps for budget in budgets]


def expand(
    definitions: dict, selected: list[str]
) -> list[tuple[str, str, dict, int | None, int | None]]:
    """(name, base, definition, budget, tp) per server: a definition expands over its TP sizes
    (`tp`) and DDTree budgets. A selected name may also be one expanded name (ddtree-tp4-b32),
    which renders that server alone. No name twice."""
    if not isinstance(definitions, dict):
        raise ServingConfigError(
            f"serving config definitions must be a mapping, got {definitions!r}"
        )
    expanded: list = []
    seen: set = set()
    for selection in selected:
        base = _split(definitions, selection)[0]
        if base not in definitions:
            raise ServingConfigError(
                f"serving config {selection!r} is not defined; known: "
                f"{', '.join(sorted(definitions))} (or one of their expanded names: "
                "<config>-tp<N>, ddtree-b<B>, ddtree-tp<N>-b<B>)"
            )
        definition = definitions[base]
        names = expansion(base, definition)
        if selection != base:
            names = [entry for entry in names if entry[0] == selection]
            if not names:
                known = ", ".join(entry[0] for entry in expansion(base, definition))
                raise ServingConfigError(
                    f"serving config {selection!r} is not one that {base} expands to: {known}"
                )
        for name, tp_size, budget_size in names:
            if name in seen:
                continue
            seen.add(name)
            expanded.append((name, base, definition, budget_size, tp_size))
    return expanded


def with_controls(definitions: dict, selected: list[str]) -> list[str]:
    """selected, plus every control config of a selected base (or of one of its expanded
    names, such as ddtree-b32 or ddtree-tp4-b32), placed just before the first config it
    controls; no name twice. A control of a TP-expanded name comes at that TP size
    (dflash-tree-backend-tp4 with ddtree-tp4-b32) when the control expands to it."""
    result: list[str] = []
    for name in (str(name) for name in selected):
        base, tp, _ = _split(definitions, name)
        for control, definition in definitions.items():
            target = (definition or {}).get("control_for")
            if not target or target != base:
                continue
            wanted = control
            if tp is not None and config_name(control, tp) in {
                entry[0] for entry in expansion(control, definition)
            }:
                wanted = config_name(control, tp)
            if wanted not in result:
                result.append(wanted)
        if name not in result:
            result.append(name)
    return result


def ordered_run(
    definitions: dict, selected: list[str], reference: str | None = None, budgets=None
) -> list[str]:
    """The benchmark's run list: every server of `selected`, expanded, each control before
    what it controls, and the reference config's servers first (its outputs exist however the
    run ends). Order: plain configs as selected, then controls, then budget configs named by
    one budget, then those expanded over all their budgets. `budgets` (benchmark_ddtree_budgets)
    replaces the definitions' own budgets when given."""
    definitions = dict(definitions or {})
    if budgets is not None:
        budgets = _sizes(list(budgets), "benchmark_ddtree_budgets", 1, MAX_BUDGET)
        definitions = {
            name: ({**d, "budgets": budgets} if (d or {}).get("budget_flag") else d)
            for name, d in definitions.items()
        }
    parsed = []
    for name in (str(name) for name in selected):
        base, _, budget = _split(definitions, name)
        if base not in definitions:
            # expand() fails on it, naming what is defined.
            expand(definitions, [name])
        parsed.append((name, base, budget))
    bases = {base for _, base, _ in parsed}
    controls = [
        control
        for control, definition in definitions.items()
        if (definition or {}).get("control_for") in bases
    ]
    budgeted = {name for name, d in definitions.items() if (d or {}).get("budget_flag")}
    plain = [n for n, base, _ in parsed if base not in budgeted and base not in controls]
    named_budgets = [n for n, base, budget in parsed if base in budgeted and budget is not None]
    whole = [n for n, base, budget in parsed if base in budgeted and budget is None]
    # A control named with a TP size (dflash-tree-backend-tp4) stays as named.
    named_controls = [n for n, base, _ in parsed if base in controls and n not in controls]
    order = plain + controls + named_controls + named_budgets + whole
    run = [entry[0] for entry in expand(definitions, order)]
    if reference:
        # The reference's servers at every TP size (is_reference: ar-tp4 for ar-tp1), and any
        # server of the reference's own definition.
        first = [
            n for n in run if is_reference(n, reference) or parse_config_name(n)[0] == reference
        ]
        run = first + [n for n in run if n not in first]
    return run


def render(
    name: str, base: str, definition: dict, budget: int | None, s: dict, tp: int | None = None
) -> dict:
    """argv, environment and runtime of one serving config on one host.

    s (settings): pythons {release, git}, model_path, draft_model_paths, tp_size,
    mem_fraction_static, kv_cache_dtype, chunked_prefill_size, attention_backends {target,
    draft, tree}, host, port, api_key, secrets_file, tool_call_parser, reasoning_parser,
    model_args (the model's launch_args), nnodes, node_rank, dist_init_addr, environment,
    release, git {url, ref}, extra_args, served_model_name, context_length (a number, or
    `auto`: the launch's entry in context_lengths, the capacity plan's figure; without one
    the flag is left out and SGLang takes the model's own). tp: the config's own TP size (a
    TP-expanded name), else the host's tp_size.
    """
    tp_size = tp if tp is not None else s["tp_size"]
    model_args = _model_args(name, s)
    context_length = resolve_context_length(name, s)
    argv = _server_argv(definition, s, tp_size, model_args, context_length)
    argv += _multi_node_args(name, s)
    argv += disaggregation_args(name, s.get("disaggregation"))
    argv += _drafter_args(name, definition, s)
    argv += [str(arg) for arg in definition.get("args") or []]
    if budget is not None:
        argv += [definition["budget_flag"], str(budget)]
    argv += _extra_args(name, s)
    access, secrets = _access_args(name, s)
    argv += access
    runtime = _runtime(name, definition, s)
    environment = {str(k): str(v) for k, v in (s.get("environment") or {}).items()}
    return {
        "name": name,
        "base": base,
        "budget": budget,
        # The GPUs this server spans (its own TP size, or the host's).
        "tp_size": int(tp_size),
        "argv": argv,
        "environment": environment,
        "runtime": runtime,
        "runtime_kind": definition.get("runtime", "release"),
        # The config this one is the control for (dflash-tree-backend: ddtree), or None.
        "control_for": definition.get("control_for"),
        "context_length": context_length,
        # Written by the server role to secrets_file (0600); never shown unmasked.
        "secrets": secrets,
    }


def _model_args(name: str, s: dict) -> list:
    """What every launch of this model needs beyond the kit's own flags (model.yml)."""
    model_args = s.get("model_args") or []
    if not isinstance(model_args, (list, tuple)):
        raise ServingConfigError(
            f"{name}: model_args (the model's launch_args) must be a list, got {model_args!r}"
        )
    return [str(arg) for arg in model_args]


def _extra_args(name: str, s: dict) -> list[str]:
    """The user's (or autotune's) flags after everything else (kimi_server_extra_args)."""
    extra = s.get("extra_args") or []
    if not isinstance(extra, (list, tuple)) or any(isinstance(a, (dict, list)) for a in extra):
        raise ServingConfigError(
            f"{name}: kimi_server_extra_args must be a list of flags and values, got "
            f"{extra!r:.120}. Fix: e.g. [--max-running-requests, 64]."
        )
    return [str(arg) for arg in extra]


def _server_argv(
    definition: dict, s: dict, tp_size, model_args: list, context_length: int | None
) -> list[str]:
    """The launch command up to the config's own flags: the runtime's Python, the model, the
    host's memory and parallelism settings, the parsers and where the server listens."""
    backends = s["attention_backends"]
    kind = definition.get("runtime", "release")
    served = s.get("served_model_name")
    return [
        s["pythons"][kind], "-m", "sglang.launch_server",
        "--model-path", s["model_path"],
        "--trust-remote-code",
        "--tp-size", str(tp_size),
        "--mem-fraction-static", str(s["mem_fraction_static"]),
        "--chunked-prefill-size", str(s["chunked_prefill_size"]),
        "--kv-cache-dtype", str(s["kv_cache_dtype"]),
        # Tree verification on an MLA target needs the tree backend (FA3 or Triton).
        "--attention-backend",
        backends["tree"] if definition.get("tree") else backends["target"],
        "--tool-call-parser", s["tool_call_parser"],
        "--reasoning-parser", s["reasoning_parser"],
        # The name /v1/models answers and OpenAI clients ask for.
        *(["--served-model-name", str(served)] if served else []),
        *(["--context-length", str(context_length)] if context_length else []),
        *model_args,
        "--host", s["host"],
        "--port", str(s["port"]),
        "--enable-metrics",
    ]  # fmt: skip


def _multi_node_args(name: str, s: dict) -> list[str]:
    """The flags that join this node to a server spanning nnodes hosts; none on one node."""
    if int(s.get("nnodes") or 1) <= 1:
        return []
    if not s.get("dist_init_addr"):
        raise ServingConfigError(
            f"{name}: nnodes {s['nnodes']} needs dist_init_addr (host:port of node rank 0)"
        )
    return [
        "--nnodes",
        str(s["nnodes"]),
        "--node-rank",
        str(s["node_rank"]),
        "--dist-init-addr",
        s["dist_init_addr"],
    ]


def disaggregation_args(name: str, d) -> list[str]:
    """SGLang's prefill-decode flags for a host that serves one side (d: the settings'
    disaggregation {mode, transfer_backend, bootstrap_port, ib_device}); none for one that
    serves both. The prefill side opens the bootstrap port its decode peers find it at."""
    try:
        mode, port = side(d)
    except ValueError as error:
        raise ServingConfigError(f"{name}: {error}") from None
    if not mode:
        return []
    argv = ["--disaggregation-mode", mode]
    argv += ["--disaggregation-transfer-backend", str(d.get("transfer_backend") or "mooncake")]
    if port is not None:
        argv += ["--disaggregation-bootstrap-port", str(port)]
    if d.get("ib_device"):
        argv += ["--disaggregation-ib-device", str(d["ib_device"])]
    return argv


def _drafter_args(name: str, definition: dict, s: dict) -> list[str]:
    """The draft model's local path and its attention backend, for a speculative config."""
    drafter = definition.get("drafter")
    if not drafter:
        return []
    path = (s.get("draft_model_paths") or {}).get(drafter)
    if not path:
        raise ServingConfigError(f"{name}: no local path for drafter {drafter!r}")
    args = ["--speculative-draft-model-path", path]
    if definition.get("draft_backend_flag"):
        args += [definition["draft_backend_flag"], s["attention_backends"]["draft"]]
    return args


def _access_args(name: str, s: dict) -> tuple[list[str], dict]:
    """(flags, secrets): the API key a server beyond loopback needs, in the root-only secrets
    file when there is one; nothing on loopback."""
    if is_loopback(s["host"]):
        return [], {}
    if not s.get("api_key"):
        raise ServingConfigError(
            f"{name}: the server listens on {s['host']}, beyond loopback; set "
            "kimi_server_api_key (ansible-vault) so that only clients with the key get in"
        )
    if s.get("secrets_file"):
        # sglang serve merges a --config YAML file into argv before parsing: the key stays
        # in a root-only file instead of /proc/<pid>/cmdline and `ps` output.
        return ["--config", s["secrets_file"]], {"api_key": s["api_key"]}
    return ["--api-key", s["api_key"]], {}


def _runtime(name: str, definition: dict, s: dict) -> str:
    """The pip requirement of the SGLang the config runs: the pinned release, or the git
    source at its ref."""
    if definition.get("runtime", "release") != "git":
        return f"sglang=={s['release']}"
    git = s.get("git") or {}
    if not git.get("url") or not git.get("ref"):
        raise ServingConfigError(f"{name}: runtime git needs kimi_sglang_git.url and .ref")
    return f"git+{git['url']}@{git['ref']}"


def resolve_context_length(name: str, s: dict) -> int | None:
    """The launch's --context-length: the user's number, or for `auto` the capacity plan's
    figure for this launch (settings' context_lengths, by launch name); None when `auto` has
    none yet (plan.yml renders first, then plans; deploy takes preflight's record)."""
    value = s.get("context_length", "auto")
    if value in (None, "") or str(value).strip().lower() == "auto":
        recorded = s.get("context_lengths")
        value = recorded.get(name) if isinstance(recorded, dict) else None
        if value is None:
            return None
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or not 1 <= int(text) <= 1 << 40:
        raise ServingConfigError(
            f"{name}: context_length is {value!r}; needed: auto or a whole number of tokens "
            "(kimi_context_length)"
        )
    return int(text)


def masked(rendered: dict) -> dict:
    """The same config with secrets replaced, for plans, results and logs."""
    argv = list(rendered["argv"])
    for index, arg in enumerate(argv):
        if arg.startswith("--api-key="):
            argv[index] = f"--api-key={MASK}"
        elif arg == "--api-key" and index + 1 < len(argv):
            argv[index + 1] = MASK
    environment = {
        key: (MASK if is_secret_name(key) else value)
        for key, value in rendered["environment"].items()
    }
    secrets = {key: MASK for key in rendered.get("secrets") or {}}
    return {**rendered, "argv": argv, "environment": environment, "secrets": secrets}


def render_all(definitions: dict, selected: list[str], settings: dict) -> list[dict]:
    return [
        render(name, base, definition, budget, settings, tp)
        for name, base, definition, budget, tp in expand(definitions, selected)
    ]


# --- contracts ----------------------------------------------------------------------------


def load_contracts(spec: dict | None, settings: dict) -> dict:
    """Per runtime kind, (contract, None) or (None, why there is none).

    spec: {release: {snapshot}, git: {snapshot, overlay}} (file paths). The release snapshot
    must be of the pinned version; the git overlay must be made for the configured ref, since
    another ref (or branch) may add or drop options the overlay does not know.
    """
    spec = spec or {}
    contracts: dict = {}
    release = spec.get("release") or {}
    try:
        contract = load_contract(release["snapshot"])
    except (KeyError, OSError, ValueError) as error:
        contracts["release"] = (None, f"no snapshot of sglang {settings.get('release')}: {error}")
    else:
        if str(contract["sglang_version"]) != str(settings.get("release")):
            contracts["release"] = (
                None,
                f"the snapshot is of sglang {contract['sglang_version']}, the pin is "
                f"{settings.get('release')}; regenerate it (tests/contract/README.md)",
            )
        else:
            contracts["release"] = (contract, None)
    git = spec.get("git") or {}
    ref = (settings.get("git") or {}).get("ref")
    try:
        contract = load_contract(git["snapshot"], git["overlay"])
        overlay_ref = _overlay_ref(git["overlay"])
    except (KeyError, OSError, ValueError) as error:
        contracts["git"] = (None, f"no contract for the git runtime: {error}")
    else:
        if overlay_ref != ref:
            contracts["git"] = (
                None,
                f"the git runtime's contract ({Path(git['overlay']).name}) is made for "
                f"{overlay_ref}, not {ref}; only the installed runtime's parser checks this "
                "argv (at deploy time)",
            )
        else:
            contracts["git"] = (contract, None)
    return contracts


# Where the kit's DDTree rules live: the overlay (what the pull request adds to the release's
# parser, and its launch rules) and the README that cites each rule's source.
DDTREE_RULE_FILES = ("tests/contract/sglang-pr29907-overlay.json", "tests/contract/README.md")
SHA = re.compile(r"^[0-9a-f]{40}$")


def ddtree_rules(overlay, locked: dict | None, git: dict | None) -> dict:
    """Whether the kit's DDTree rules were read at the commit this study runs.

    overlay: the overlay's JSON (its sources.commit_read is the commit the rules were read
    at; applies_to.ref the ref they were made for). locked: the study lock's pin of the git
    source ({url, ref, commit}) or None. git: kimi_sglang_git ({url, ref}). The pull request
    moves: a newer head may rename a flag or drop a rule, and the plan's contract check would
    still pass on rules that no longer hold. drift is True when the commit the study runs is
    known and is not the one read, None when it is not known yet (no lock entry, a ref that is
    no commit), False when they are the same."""

    def field(value, key):
        return value.get(key) if isinstance(value, dict) else None

    read_at = field(field(overlay, "sources"), "commit_read")
    read_at = read_at if isinstance(read_at, str) and SHA.match(read_at) else None
    made_for = field(field(overlay, "applies_to"), "ref")
    made_for = made_for if isinstance(made_for, str) else None
    git = git if isinstance(git, dict) else {}
    ref = str(git.get("ref") or "")
    commit = field(locked, "commit")
    commit = commit if isinstance(commit, str) and SHA.match(commit) else None
    if commit is None and SHA.match(ref):
        commit = ref
    files = ", ".join(DDTREE_RULE_FILES)
    record = {
        "read_at": read_at,
        "made_for_ref": made_for,
        "ref": ref or None,
        "commit": commit,
        "files": list(DDTREE_RULE_FILES),
    }
    if read_at is None:
        return {
            **record,
            "drift": None,
            "message": f"The kit's DDTree rules name no commit they were read at ({files}).",
        }
    if commit is None:
        return {
            **record,
            "drift": None,
            "message": (
                f"The kit's DDTree rules were read at {read_at}; the commit {ref} resolves to is "
                "not in the study lock yet (plan.yml resolves it when github.com answers), so "
                "whether they still hold is unknown. The canary stage runs every DDTree config "
                "on the hosts before the download."
            ),
        }
    if commit == read_at:
        return {
            **record,
            "drift": False,
            "message": (
                f"The kit's DDTree rules were read at {read_at}, the commit this study runs."
            ),
        }
    return {
        **record,
        "drift": True,
        "message": (
            f"DDTree's SGLang runs at commit {commit} ({ref}), but the kit's DDTree rules were "
            f"read at {read_at}: the pull request moved since. Re-read it at {commit} and update "
            f"{files} (flags, environment knobs, launch rules); until then the plan checks the "
            "launch commands against rules that may no longer hold, and the canary stage (run "
            "by deploy_kimi.yml before the download) is the check that they still do."
        ),
    }


def _overlay_ref(path) -> str | None:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return ((data.get("applies_to") or {}).get("ref")) if isinstance(data, dict) else None


def validation(rendered: dict, contracts: dict) -> dict:
    """{ok, errors, contract} for one rendered config: ok is None when no contract applies."""
    contract, why = contracts.get(rendered["runtime_kind"], (None, "unknown runtime"))
    if contract is None:
        return {"ok": None, "errors": [], "contract": None, "note": why}
    argv = list(rendered["argv"])
    # argv[0:3] is `<python> -m sglang.launch_server`; the parser sees what follows.
    errors = [str(error) for error in check_argv(argv[3:], contract)]
    errors += check_environment(rendered.get("environment") or {}, contract)
    return {"ok": not errors, "errors": errors, "contract": contract_name(contract)}
