"""Serving configs rendered into a launch argv, an environment and a runtime, per host.

The one place where `python -m sglang.launch_server` flags are written: the server role and
plan.yml both call render_all(). Configs are data (group_vars/all/serving.yml); the profile
supplies attention backends, TP size and memory settings. plan.yml checks every argv against
its runtime's contract (tests/contract: the pinned release's parser, plus the DDTree pull
request's overlay for the git runtime) and records the verdict; the server role has the
installed runtime's own parser check it before a (re)start (module_utils/launch_check.py).

A config with `control_for: <base>` is a control that comes along whenever that base is
selected (with_controls): dflash-tree-backend, the DFlash chain on the DDTree servers' backend,
page size and scheduler, so DDTree-vs-chain differences are the tree's.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

from ansible.module_utils.host_helpers import MASK
from ansible.module_utils.sglang_args import (
    check_argv,
    check_environment,
    contract_name,
    load_contract,
)

SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "SGLANG_API_KEY")


class ServingConfigError(Exception):
    pass


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def expand(definitions: dict, selected: list[str]) -> list[tuple[str, str, dict, int | None]]:
    """(name, base config, definition, budget): DDTree budgets become one config each."""
    expanded = []
    for base in selected:
        if base not in definitions:
            raise ServingConfigError(
                f"serving config {base!r} is not defined; known: {', '.join(sorted(definitions))}"
            )
        definition = definitions[base]
        budgets = definition.get("budgets") or []
        if definition.get("budget_flag") and budgets:
            for budget in budgets:
                if int(budget) < 1:
                    raise ServingConfigError(f"{base} budget {budget} must be at least 1")
                expanded.append((f"{base}-b{int(budget)}", base, definition, int(budget)))
        else:
            expanded.append((base, base, definition, None))
    return expanded


def with_controls(definitions: dict, selected: list[str]) -> list[str]:
    """selected, plus every control config of a selected base (or of one of its budgets, such as
    ddtree-b32), placed just before the first config it controls; no name twice."""
    result: list[str] = []
    for name in (str(name) for name in selected):
        for control, definition in definitions.items():
            target = (definition or {}).get("control_for")
            if target and target == _base_name(name) and control not in result:
                result.append(control)
        if name not in result:
            result.append(name)
    return result


def _base_name(name: str) -> str:
    head, _, tail = name.rpartition("-b")
    return head if head and tail.isdigit() else name


def render(name: str, base: str, definition: dict, budget: int | None, s: dict) -> dict:
    """argv, environment and runtime of one serving config on one host.

    s (settings): pythons {release, git}, model_path, draft_model_paths, tp_size,
    mem_fraction_static, kv_cache_dtype, chunked_prefill_size, attention_backends {target,
    draft, tree}, host, port, api_key, secrets_file, tool_call_parser, reasoning_parser,
    nnodes, node_rank, dist_init_addr, environment, release, git {url, ref}, extra_args.
    """
    tree = bool(definition.get("tree"))
    secrets: dict = {}
    backends = s["attention_backends"]
    kind = definition.get("runtime", "release")
    argv = [
        s["pythons"][kind], "-m", "sglang.launch_server",
        "--model-path", s["model_path"],
        "--trust-remote-code",
        "--tp-size", str(s["tp_size"]),
        "--mem-fraction-static", str(s["mem_fraction_static"]),
        "--chunked-prefill-size", str(s["chunked_prefill_size"]),
        "--kv-cache-dtype", str(s["kv_cache_dtype"]),
        # Tree verification on an MLA target needs the tree backend (FA3 or Triton).
        "--attention-backend", backends["tree"] if tree else backends["target"],
        "--tool-call-parser", s["tool_call_parser"],
        "--reasoning-parser", s["reasoning_parser"],
        "--host", s["host"],
        "--port", str(s["port"]),
        "--enable-metrics",
    ]  # fmt: skip
    if int(s.get("nnodes") or 1) > 1:
        if not s.get("dist_init_addr"):
            raise ServingConfigError(
                f"{name}: nnodes {s['nnodes']} needs dist_init_addr (host:port of node rank 0)"
            )
        argv += [
            "--nnodes",
            str(s["nnodes"]),
            "--node-rank",
            str(s["node_rank"]),
            "--dist-init-addr",
            s["dist_init_addr"],
        ]
    drafter = definition.get("drafter")
    if drafter:
        path = (s.get("draft_model_paths") or {}).get(drafter)
        if not path:
            raise ServingConfigError(f"{name}: no local path for drafter {drafter!r}")
        argv += ["--speculative-draft-model-path", path]
        if definition.get("draft_backend_flag"):
            argv += [definition["draft_backend_flag"], backends["draft"]]
    argv += [str(arg) for arg in definition.get("args") or []]
    if budget is not None:
        argv += [definition["budget_flag"], str(budget)]
    argv += [str(arg) for arg in s.get("extra_args") or []]
    if not is_loopback(s["host"]):
        if not s.get("api_key"):
            raise ServingConfigError(
                f"{name}: the server listens on {s['host']}, beyond loopback; set "
                "kimi_server_api_key (ansible-vault) so that only clients with the key get in"
            )
        if s.get("secrets_file"):
            # sglang serve merges a --config YAML file into argv before parsing: the key stays
            # in a root-only file instead of /proc/<pid>/cmdline and `ps` output.
            argv += ["--config", s["secrets_file"]]
            secrets = {"api_key": s["api_key"]}
        else:
            argv += ["--api-key", s["api_key"]]
    if definition.get("runtime", "release") == "git":
        git = s.get("git") or {}
        if not git.get("url") or not git.get("ref"):
            raise ServingConfigError(f"{name}: runtime git needs kimi_sglang_git.url and .ref")
        runtime = f"git+{git['url']}@{git['ref']}"
    else:
        runtime = f"sglang=={s['release']}"
    environment = {str(k): str(v) for k, v in (s.get("environment") or {}).items()}
    return {
        "name": name,
        "base": base,
        "budget": budget,
        "argv": argv,
        "environment": environment,
        "runtime": runtime,
        "runtime_kind": definition.get("runtime", "release"),
        # The config this one is the control for (dflash-tree-backend: ddtree), or None.
        "control_for": definition.get("control_for"),
        # Written by the server role to secrets_file (0600); never shown unmasked.
        "secrets": secrets,
    }


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return upper in SECRET_ENV or any(
        word in upper for word in ("TOKEN", "KEY", "SECRET", "PASSWORD", "PROXY")
    )


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
        render(name, base, definition, budget, settings)
        for name, base, definition, budget in expand(definitions, selected)
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
