"""Serving configs rendered into a launch argv, an environment and a runtime, per host.

The one place where `python -m sglang.launch_server` flags are written: the server role and
plan.yml both call render_all(). Configs are data (group_vars/all/serving.yml); the profile
supplies attention backends, TP size and memory settings. Every argv for a config whose
runtime is the pinned release is checked against that release's parser (tests/contract).
"""

from __future__ import annotations

import ipaddress

MASK = "********"
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
