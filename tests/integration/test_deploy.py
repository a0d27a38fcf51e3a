"""The whole study end to end over SSH test hosts, a PCIe ct200 host serving Kimi K2.6 and an
NVSwitch b200 host serving the hybrid control Qwen3.6-27B (`kimi_model: qwen3.6-27b` as a host
variable), at once: deploy_kimi.yml (preflight, the canary of every config of each model's
default study on tiny same-architecture checkpoints, each model's weights from a local hub, the
release runtime with the simulator packaged as sglang 0.5.23 and the git runtime built from a
local copy of the DDTree pull request's ref, tuning with kernel values under a private tree, the
server), then benchmark_kimi.yml as one run per model (--limit to its host, both at once: ar,
dflash (K2.6 only), the chain control dflash-tree-backend and DDTree at each model's own
budgets, 16 to 128 for K2.6 and 15, 32, 64 for Qwen, at two levels), then `python -m analysis
report` of each run and `python -m analysis compare` of the two; a second deploy changes
nothing and does not restart the servers; plan.yml lists what deploy ran, each model's plan in
its own folder.

The simulator plays a DDTree budget sweep per host from tests/support/ddtree_tables.py: the K2.6
host a healthy pure-attention one (accepted tokens per step rising, then saturating), the Qwen
host one shaped like the published hybrid study (block size 16), so the comparison must carry a
collapse warning for the hybrid run only.

The b200 host boots systemd as PID 1, as real GPU hosts do: its fabric manager and its server
are systemd units. The ct200 host runs sshd as PID 1 (a container): the kit's supervisor runs
its server.

The run connects to the ct200 host as an unprivileged user with passwordless sudo (the test
hosts' SUDO_USER), so the kit works there through `become`, and to the b200 host as root, where
it does not escalate: one run proves both, and every check below holds for each. The files that
must be root-only (the server's environment and secrets files, the per-host lock) are owned by
root with mode 0600 either way, and the HF token's file is gone once the download ends."""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from analysis.sweep import NEAR_BEST
from tests.support.archives import extract_files
from tests.support.ddtree_tables import HEALTHY, QWEN_HYBRID, pairs, table_env
from tests.support.fake_sglang import build_git_source
from tests.support.hostprep import EXTRAVARS as TUNING_VARS
from tests.support.hostprep import install_fabricmanager, install_git_source, prepare_host
from tests.support.hub_server import LocalHub, add_fixture_repos, token_env
from tests.support.models import model
from tests.support.results_tree import Sim, implied_speedup_range
from tests.support.testhosts import SUDO_USER

REPO = Path(__file__).resolve().parents[2]
# The first test carries the whole deploy, benchmark and report (its fixture): about 8 minutes
# alone, more while other test files run beside it under make test.
# The deploy fixture took 1,350 s of 1,500 on a fresh 2-core CI machine once the canary stage
# joined it: the limit is a hang's deadline, not a speed target.
pytestmark = [pytest.mark.runtime, pytest.mark.integration, pytest.mark.timeout(2400)]

TOKEN = "hf_deploy_good_2b7e41"
# The server's API key, handed over as a vault-like vars file (never as extra vars, which
# ansible-runner writes into its own env/extravars).
API_KEY = "sk-kimi-e2e-7f3a9c51e2d4"
HOSTS = ["ct200-a", "b200-a"]
SYSTEMD_HOST = "b200-a"
# The hybrid control runs on the systemd host, K2.6 on the other; each model is one run.
KIMI_HOST, QWEN_HOST = "ct200-a", SYSTEMD_HOST
# Reached as the test hosts' unprivileged sudo user (ansible_user), the other host as root.
SUDO_HOST = KIMI_HOST
MODELS = {KIMI_HOST: "kimi-k2.6", QWEN_HOST: "qwen3.6-27b"}
RUNS = {KIMI_HOST: "e2e-k26", QWEN_HOST: "e2e-qwen"}
# The simulator's settings: 5 ms steps, 4 tokens accepted per verify step under speculation,
# next to no prefill, so dflash over ar is close to 4x by construction (256 tokens: the prefill
# token, then 255 decode steps against 64 verify steps). Fewer tokens would blur the tokens a
# step read back per budget (a last, partial verify step weighs more); four prompts are one
# wave at concurrency 4 and keep ar at concurrency 1, the longest level, to about 5 s.
STEP_MS, ACCEPT, MAX_NEW_TOKENS, PREFILL_MS, PROMPTS = 5, 4, 256, 1, 4
SIM_ENV = {
    "HF_HUB_OFFLINE": "1",
    # Nothing reads the load time but the health wait, which polls every second.
    "SGLANG_SIM_LOAD_SECONDS": "1",
    "SGLANG_SIM_STEP_MS": str(STEP_MS),
    "SGLANG_SIM_ACCEPT": str(ACCEPT),
    "SGLANG_SIM_PREFILL_MS": str(PREFILL_MS),
}
# DDTree per budget: a healthy sweep on K2.6, the published hybrid collapse on Qwen. Step times
# shrink to a fifth (about 6 ms a step on K2.6, 15 to 17 ms on Qwen) so the sweep runs quickly;
# the diagnosis reads ratios between budgets, which the scale keeps.
SWEEPS = {KIMI_HOST: HEALTHY, QWEN_HOST: QWEN_HYBRID}
STEP_SCALE = 0.2
# Each model's kimi_ddtree_budgets (K2.6 16 to 128; Qwen 15, 32, 64: 15 is its block size - 1).
BUDGETS = {host: model(name)["ddtree_budgets"] for host, name in MODELS.items()}
DDTREE_CONFIGS = {host: [f"ddtree-b{b}" for b in budgets] for host, budgets in BUDGETS.items()}
CHAIN = "dflash-tree-backend"
# The chain control: DFlash's chain on the tree backend, a little faster a step than the
# smallest tree and accepting fewer tokens (K2.6 at most 8 a step, Qwen at most 16). On Qwen
# it runs 20% under budget 15 (714 against 862 tok/s), so which is fastest is not timing noise.
CHAIN_ENV = {
    KIMI_HOST: {"SGLANG_SIM_STEP_MS": "5.8", "SGLANG_SIM_ACCEPT": "4.4"},
    QWEN_HOST: {"SGLANG_SIM_STEP_MS": "16.8", "SGLANG_SIM_ACCEPT": "12"},
}
# The hybrid's run is the contrast: AR, the chain control and the budgets. Its dflash on the
# release runtime is the plan's and the contracts' (tests/integration/test_plan.py) and would
# only add a server to this, the longest fixture of make test.
SERVED = {KIMI_HOST: ["ar", "dflash", "ddtree"], QWEN_HOST: ["ar", "ddtree"]}
CONFIGS = {
    host: [*(c for c in SERVED[host] if c != "ddtree"), CHAIN, *DDTREE_CONFIGS[host]]
    for host in HOSTS
}
LEVELS = (1, 4)
# A canary that does not serve within this fails (the default waits up to 900 s).
CANARY_TIMEOUT_S = 120


def canaried_configs(host: str) -> list[str]:
    """What the host's kimi_serving_configs (its model's) expand to, in the benchmark's order."""
    served = model(MODELS[host])["serving_configs"]
    return [*(c for c in ("ar", "eagle3", "dflash") if c in served), CHAIN, *DDTREE_CONFIGS[host]]


def drafter(host: str) -> str:
    return model(MODELS[host])["drafters"]["dflash"]["repo_id"]


def block_size(host: str) -> int:
    """The DFlash drafter's block size: the tokens a verify step of the chain sees."""
    args = [str(a) for a in model(MODELS[host])["serving_config_definitions"]["dflash"]["args"]]
    return int(args[args.index("--speculative-num-draft-tokens") + 1])


def host_environment(host: str) -> dict:
    return {**SIM_ENV, "SGLANG_SIM_DDTREE_TABLE": table_env(SWEEPS[host], STEP_SCALE)}


@pytest.fixture(scope="module")
def cluster():
    from tests.support.testhosts import TestHostCluster

    hosts = TestHostCluster.up(["ct200", "b200"], names=HOSTS, systemd=[SYSTEMD_HOST])
    try:
        for name in HOSTS:
            prepare_host(hosts, name, cpufreq=False)
        install_fabricmanager(hosts, "b200-a")
        # Host variables, so each host serves its own model and its simulator plays its own
        # sweep (extra vars would win over both). The K2.6 host is reached as the sudo user.
        hosts.write_inventory(
            sudo_user_hosts=[SUDO_HOST],
            host_vars={
                KIMI_HOST: {"kimi_server_environment": host_environment(KIMI_HOST)},
                QWEN_HOST: {
                    "kimi_model": MODELS[QWEN_HOST],
                    "kimi_server_environment": host_environment(QWEN_HOST),
                },
            },
        )
        yield hosts
    finally:
        hosts.down()


@pytest.fixture(scope="module")
def hub(cluster):
    # Each model's repositories as the real ones list their small files (config, tokenizer,
    # chat template: the canary makes its tiny checkpoints from them) and small valid weights.
    with LocalHub(host=cluster.gateway) as hub:
        hub.valid_tokens.add(TOKEN)
        for name in sorted(set(MODELS.values())):
            add_fixture_repos(hub, model(name), {TOKEN})
        yield hub


@pytest.fixture(scope="module")
def deploy(cluster, hub, wheelhouse, runtime_wheelhouse, tmp_path_factory):
    from tests.support.ansible_run import run_playbook

    secrets = tmp_path_factory.mktemp("secrets")
    key_file = secrets / "server-key.yml"
    key_file.touch(mode=0o600)
    key_file.write_text(json.dumps({"kimi_server_api_key": API_KEY}))
    source = tmp_path_factory.mktemp("sglang-source")
    git = build_git_source(source)
    for name in HOSTS:
        git["url"] = install_git_source(cluster, name, source)
    state_root = Path(cluster.state_dir) / "controller-state"
    extravars = {
        **TUNING_VARS,
        # Each model's own kimi_serving_configs: K2.6's adds eagle3 to the hybrid's ar, dflash
        # and ddtree, so the K2.6 host's canary runs every config of the default study.
        "kimi_server_config": "dflash",
        "kimi_canary_timeout_s": CANARY_TIMEOUT_S,
        # Beyond loopback, so the API key is in force (on loopback the kit sets none).
        "kimi_server_host": "0.0.0.0",  # noqa: S104 - inside the test host's own namespace
        "kimi_hf_endpoint": hub.url,
        "kimi_sglang_git": {"url": git["url"], "ref": git["ref"], "patches": []},
        # The kit's own per-model folder (state/<host>/, state/<model>/<host>/), moved out of
        # the checkout: each host's model picks its folder.
        "weights_controller_state_dir": moved(
            "kimi_controller_state_dir", "state", str(state_root)
        ),
        "canary_controller_state_dir": moved("kimi_controller_state_dir", "state", str(state_root)),
        # Preflight's record of each launch's context length, which the server stage reads.
        "kimi_context_lengths_file": moved("kimi_controller_state_dir", "state", str(state_root))
        + "/{{ inventory_hostname }}/context-lengths.json",
        "weights_wheelhouse": str(wheelhouse),
        "weights_poll_interval": 5,
        "weights_download_environment": {"HF_HUB_DISABLE_XET": "1"},
        "runtime_wheelhouse": str(runtime_wheelhouse),
        "server_health_poll_s": 1,
    }

    def arguments(name: str, playbook: str = "deploy_kimi.yml", limit=None, **more) -> dict:
        return {
            "playbook": playbook,
            "inventory": cluster.inventory,
            "private_dir": tmp_path_factory.mktemp(name),
            "extravars": {**extravars, **more},
            "envvars": {**token_env(TOKEN, secrets), "HF_HUB_DISABLE_XET": "1"},
            "vars_files": [key_file],
            "limit": limit,
        }

    def run(name: str, playbook: str = "deploy_kimi.yml", **more):
        return run_playbook(**arguments(name, playbook, **more))

    first = run("deploy-1")
    pids = {name: server_pid(cluster, name) for name in HOSTS} if first.rc == 0 else {}
    results = tmp_path_factory.mktemp("results")
    prompts = tmp_path_factory.mktemp("prompts") / "questions.jsonl"
    prompts.write_text(
        "".join(
            json.dumps(
                {"messages": [{"role": "user", "content": f"Question {i}: what is {i}+{i}?"}]}
            )
            + "\n"
            for i in range(PROMPTS)
        )
    )
    # One run per model, limited to its host, both at once: each model's run.json names it,
    # and the two runs together take as long as the longer one. Each runs in a process of its
    # own, since run_playbook sets the environment of the process it runs in.
    bench_args = {
        host: {
            "name": f"benchmark-{MODELS[host]}",
            "playbook": "benchmark_kimi.yml",
            "limit": host,
            "benchmark_concurrency": list(LEVELS),
            "benchmark_serving_configs": SERVED[host],
            "benchmark_server_environment": {CHAIN: CHAIN_ENV[host]},
            "benchmark_num_prompts": PROMPTS,
            # Every level sends the same PROMPTS prompts (1 x 4 at c4), so levels compare.
            "benchmark_requests_per_concurrency": 1,
            "benchmark_max_new_tokens": MAX_NEW_TOKENS,
            "benchmark_warmup_requests": 1,
            "benchmark_run_id": RUNS[host],
            "benchmark_results_dir": str(results),
            "benchmark_prompt_sets": [],
            "benchmark_prompt_files": {"questions": str(prompts)},
        }
        for host in HOSTS
    }
    with ProcessPoolExecutor(len(HOSTS), mp_context=multiprocessing.get_context("fork")) as pool:
        running = {
            host: pool.submit(run_playbook, **arguments(**args))
            for host, args in bench_args.items()
        }
        bench = {host: future.result(timeout=1200) for host, future in running.items()}
    pids_after_benchmark = {name: server_pid(cluster, name) for name in HOSTS}
    report_dir = tmp_path_factory.mktemp("report")
    reports = {host: report_dir / MODELS[host] for host in HOSTS}
    comparison = report_dir / "compare"
    # The analyses read files the second deploy does not touch: they run beside it.
    commands = {
        **{
            host: ["report", str(results / RUNS[host]), "--out", str(reports[host])]
            for host in HOSTS
        },
        "compare": [
            "compare",
            str(results / RUNS[KIMI_HOST]),
            str(results / RUNS[QWEN_HOST]),
            "--out",
            str(comparison),
        ],
    }
    started = {
        key: subprocess.Popen(
            [sys.executable, "-m", "analysis", *args, "--workers", "1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for key, args in commands.items()
    }
    try:
        second = run("deploy-2")
    finally:
        analysis = {key: finished(process) for key, process in started.items()}
    return {
        "secrets": secrets,
        "key_file": key_file,
        "report_dir": report_dir,
        "first": first,
        "second": second,
        "pids": pids,
        "pids_after_benchmark": pids_after_benchmark,
        "bench": bench,
        "results": {host: results / RUNS[host] for host in HOSTS},
        "analysis": analysis,
        "reports": reports,
        "compare": comparison,
        "extravars": extravars,
        "state_root": state_root,
    }


def moved(variable: str, folder: str, root: str) -> str:
    """The kit's own <kit>/<folder>[/<model>] path of a host, with <kit>/<folder> moved to root:
    extra vars are templated per host, so each host's model still picks its subfolder."""
    return f"{{{{ {variable} | replace(kimi_kit_dir ~ '/{folder}', '{root}') }}}}"


def finished(process: subprocess.Popen, timeout: float = 300) -> subprocess.CompletedProcess:
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate(timeout=30)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def server_pid(cluster, host: str) -> int:
    if host == SYSTEMD_HOST:
        return int(cluster.ssh(host, "systemctl show -p MainPID --value kimi-sglang").stdout)
    state = cluster.ssh(host, "cat /var/lib/kimi/server/kimi-sglang.state.json").stdout
    return int(json.loads(state)["child_pid"] or 0)


def test_deploy_ends_with_a_healthy_server_on_every_host(cluster, deploy):
    first = deploy["first"]
    assert first.rc == 0, first.stdout
    health = first.server_health()
    assert {host: health[host]["state"] for host in HOSTS} == dict.fromkeys(HOSTS, "healthy")
    launches = {}
    for host in HOSTS:
        launch = json.loads(cluster.ssh(host, "cat /var/lib/kimi/server/launch.json").stdout)
        launches[host] = launch
        assert launch["config"] == "dflash" and launch["runtime"] == "sglang==0.5.23"
        assert launch["argv"][0] == "/opt/kimi/venv/bin/python"
        # Each host serves its own model with that model's drafter.
        target = model(MODELS[host])["target"]["repo_id"]
        assert argument(launch["argv"], "--model-path") == f"/opt/kimi/weights/{target}"
        assert f"/opt/kimi/weights/{drafter(host)}" in launch["argv"]
        # The profile's NCCL settings reach the server and /etc/nccl.conf alike.
        nccl = cluster.ssh(host, "cat /etc/nccl.conf").stdout
        for key, value in launch["environment"].items():
            if key.startswith("NCCL_"):
                assert f"{key}={value}" in nccl
    assert launches[KIMI_HOST]["environment"]["NCCL_P2P_DISABLE"] == "1"
    # TP size, parsers and the target's attention backend come from each model's folder: K2.6
    # spans the eight GPUs; Qwen runs at TP1 with its own parsers, and on the b200 host its
    # attention runs on its own profile entry, not on the MLA-only trtllm_mla K2.6 gets there.
    kimi, qwen = launches[KIMI_HOST]["argv"], launches[QWEN_HOST]["argv"]
    assert argument(kimi, "--tp-size") == "8" and argument(qwen, "--tp-size") == "1"
    assert argument(kimi, "--tool-call-parser") == "kimi_k2"
    assert argument(qwen, "--tool-call-parser") == "qwen3_coder"
    assert argument(qwen, "--reasoning-parser") == "qwen3"
    backend = model(MODELS[QWEN_HOST])["profiles"]["b200"]["target_attention_backend"]
    assert argument(qwen, "--attention-backend") == backend != "trtllm_mla"
    assert argument(qwen, "--speculative-num-draft-tokens") == "16"
    # The weights stage's controller records went to each model's own folder.
    state = deploy["state_root"]
    assert (state / KIMI_HOST / "weights.json").is_file()
    assert (state / MODELS[QWEN_HOST] / QWEN_HOST / "weights.json").is_file()
    assert not (state / QWEN_HOST).exists()
    # Once healthy, each server answers the OpenAI API as users call it, through its own
    # model's parsers: the name it was launched with, chat (whole and streamed), a forced tool
    # call and reasoning apart from the content.
    for host in HOSTS:
        check = json.loads(cluster.ssh(host, "cat /var/lib/kimi/server/api-check.json").stdout)
        assert check["passed"] is True, check
        assert {c["name"]: c["passed"] for c in check["checks"]} == dict.fromkeys(
            ("models", "chat", "chat_stream", "tool_call", "reasoning"), True
        ), check
        name = argument(launches[host]["argv"], "--served-model-name")
        assert check["served_model_name"] == name == model(MODELS[host])["target"]["repo_id"]


def test_the_canary_ran_every_config_of_each_host_before_its_download(cluster, deploy):
    """The deploy's canary stage: every config the host serves and benchmarks, on its own model's
    tiny checkpoints, passed before the download; the second deploy ran none again."""
    first, second = deploy["first"], deploy["second"]
    assert first.rc == 0, first.stdout
    for host in HOSTS:
        canaried = canaried_configs(host)
        record = json.loads(cluster.ssh(host, "cat /opt/kimi/canary/canary.json").stdout)
        assert record["model"] == MODELS[host]
        assert record["passed"] == canaried and record["failed"] == [], record
        controller = json.loads(
            (
                deploy["state_root"]
                / (host if host == KIMI_HOST else f"{MODELS[host]}/{host}")
                / "canary.json"
            ).read_text()
        )
        assert controller == record
        said = first.results("Say how the canary went")[host]["msg"]
        assert said.startswith(f"Canary: {len(canaried)} of {len(canaried)} serving"), said
    task = "Run the canary of each config that must run"
    outcomes = {
        (event["event"], event["event_data"]["host"])
        for event in second.events
        if event["event_data"].get("task") == task
        and event["event"] in ("runner_on_ok", "runner_on_skipped", "runner_on_failed")
    }
    assert outcomes == {("runner_on_skipped", host) for host in HOSTS}, outcomes


def test_every_config_of_the_default_study_passes_its_canary_before_the_download(cluster, deploy):
    """The K2.6 host serves every config of its model's default study (ar, eagle3, dflash, the
    chain control, each DDTree budget): each canary passes on tiny checkpoints, from the small
    files the weights stage's transfer fetched, and the download follows."""
    first = deploy["first"]
    assert first.rc == 0, first.stdout[-6000:]
    configs = canaried_configs(KIMI_HOST)
    record = json.loads(cluster.ssh(KIMI_HOST, "cat /opt/kimi/canary/canary.json").stdout)
    assert record["kind"] == "kimi.canary" and record["schema_version"] == 1
    assert record["host"] == KIMI_HOST and record["profile"] == "ct200"
    assert record["compute_capability"] == "12.0"
    # The configs in the order the run took them.
    assert list(record["configs"]) == configs and record["passed"] == configs
    assert record["failed"] == record["skipped"] == []
    for name, entry in record["configs"].items():
        assert entry["state"] == "ok" and entry["failure"] is None, (name, entry)
        assert 0 < entry["seconds_to_ready"] <= entry["seconds"] < CANARY_TIMEOUT_S, (name, entry)
        assert entry["generate"]["completion_tokens"] == 8 and entry["chat"] == {"ok": True}
        speculative = name != "ar"
        assert (entry["generate"]["spec_verify_ct"] is not None) == speculative, (name, entry)
        assert entry["log"] == f"/opt/kimi/canary/logs/{name}.log"
    # Tiny checkpoints of the target and both drafters, under 1 GiB together.
    checkpoints = record["checkpoints"]
    assert set(checkpoints) == {"target", "dflash", "eagle3"}
    assert sum(c["bytes"] for c in checkpoints.values()) < 1 << 30
    assert checkpoints["target"]["path"] == "/opt/kimi/canary/checkpoints/moonshotai/Kimi-K2.6"
    # The controller's copy is the host's.
    assert json.loads((deploy["state_root"] / KIMI_HOST / "canary.json").read_text()) == record
    # Sources: the small files only, through the weights stage's transfer (its manifest); the
    # gated drafter's folder root:kimi 0750 as in the weights stage.
    listing = cluster.ssh(KIMI_HOST, "cd /opt/kimi/canary/sources && find . -type f | sort").stdout
    assert "./moonshotai/Kimi-K2.6/config.json" in listing
    assert "./moonshotai/Kimi-K2.6/chat_template.jinja" in listing
    assert "./moonshotai/Kimi-K2.6/kimi-manifest.json" in listing
    assert ".safetensors" not in listing, listing
    gated = "/opt/kimi/canary/sources/z-lab/Kimi-K2.6-DFlash"
    gated = cluster.ssh(KIMI_HOST, f"stat -c '%U:%G %a' {gated}")
    assert gated.stdout.split() == ["root:kimi", "750"]
    logs = "/opt/kimi/canary/logs /opt/kimi/canary/logs/ar.log"
    logs = cluster.ssh(KIMI_HOST, f"stat -c '%a' {logs}")
    assert logs.stdout.split() == ["700", "600"]
    # After the canary, the download: the real weights are there.
    weights = cluster.ssh(KIMI_HOST, "ls /opt/kimi/weights/moonshotai/Kimi-K2.6").stdout
    assert "model-00001-of-00004.safetensors" in weights
    # The summary and the stage say per host how it went.
    said = first.results("Say how each canary went")[KIMI_HOST]["msg"]
    assert said[0] == f"Canary: {len(configs)} of {len(configs)} serving configs passed.", said
    summary = first.results("Say how the canary went")[KIMI_HOST]["msg"]
    assert summary.startswith(f"Canary: {len(configs)} of {len(configs)} serving configs passed.")


def test_the_host_records_what_preflight_found_and_what_the_runtime_says_of_itself(cluster, deploy):
    """preflight.json holds the GPUs' compute capability (both hosts: 12.0 on the RTX PRO 6000
    host, 10.0 on the B200 one); runtime.json holds, per runtime, `python -m sglang.check_env`
    as the runtime printed it (the GPUs it saw and their compute capability) and the kernel
    packages' versions."""
    assert deploy["first"].rc == 0, deploy["first"].stdout
    capability = {KIMI_HOST: "12.0", QWEN_HOST: "10.0"}
    for host in HOSTS:
        preflight = json.loads(cluster.ssh(host, "cat /var/lib/kimi/preflight.json").stdout)
        assert preflight["passed"] is True and preflight["compute_capability"] == capability[host]
        runtime = json.loads(cluster.ssh(host, "cat /opt/kimi/runtime/runtime.json").stdout)
        for kind in ("release", "git"):
            check_env = runtime[kind]["check_env"]
            assert check_env["ok"] is True, (host, kind, check_env)
            lines = check_env["output"].splitlines()
            assert "CUDA available: True" in lines
            assert f"GPU 0,1,2,3,4,5,6,7 Compute Capability: {capability[host]}" in lines
            assert set(runtime[kind]["kernels"]) >= {"sglang-kernel", "flashinfer-python"}


def test_the_sudo_user_deployed_its_host_through_become(cluster, deploy):
    """The K2.6 host was reached as the sudo user (only Ansible connecting as it leaves its
    remote temporary folder in its home) and everything the roles wrote there is root's, as on
    the host reached as root: nothing of the deploy belongs to the user it connected as."""
    assert deploy["first"].rc == 0, deploy["first"].stdout
    home = cluster.ssh(SUDO_HOST, f"stat -c '%U %a' /home/{SUDO_USER}/.ansible/tmp").stdout
    assert home.split() == [SUDO_USER, "700"], home
    for host in HOSTS:
        written = "/etc/kimi /opt/kimi /var/lib/kimi /etc/nccl.conf"
        theirs = cluster.ssh(host, f"find {written} ! -user root -printf '%u %p\\n'").stdout
        assert not theirs, (host, theirs)
        # The released lock leaves its root-only folder and flock guard behind.
        lock = "/var/lib/kimi/lock /var/lib/kimi/lock/lock.json.guard"
        said = cluster.ssh(host, f"stat -c '%U %a' {lock}").stdout
        assert said.split() == ["root", "700", "root", "600"], (host, said)


def argument(argv: list[str], flag: str) -> str:
    assert flag in argv, (flag, argv)
    return argv[argv.index(flag) + 1]


def test_deploy_ends_with_each_hosts_endpoint_and_a_working_curl(cluster, deploy):
    first = deploy["first"]
    summary = first.results("Say where the server answers and how to check it")
    for host in HOSTS:
        msg = summary[host]["msg"]
        assert f"at http://{cluster.host(host).address}:30000." in msg, msg
        command = msg.splitlines()[-1].strip()
        assert "| curl -sS -H @- http://127.0.0.1:30000/v1/models" in command, msg
        # Run as printed, by the user the deploy connected as: the sudo user reads the
        # root-only key file through sudo, root without it (minimal images have no sudo).
        assert command.startswith("sudo ") == (host == SUDO_HOST), msg
        answer = cluster.ssh(host, command, user=SUDO_USER if host == SUDO_HOST else "root")
        assert model(MODELS[host])["target"]["repo_id"] in answer.stdout
    assert API_KEY not in first.stdout
    assert not any(API_KEY in json.dumps(event) for event in first.events)
    for host in HOSTS:
        said = deploy["bench"][host].results("Say where the results are and how to report them")
        msg = said[host]["msg"]
        assert f"{deploy['results'][host]}/{host}/" in msg, msg
        assert msg.rstrip().endswith(f"-m analysis report {deploy['results'][host]}"), msg


def test_benchmark_lands_results_for_every_host_config_and_level(deploy):
    for host in HOSTS:
        bench, results = deploy["bench"][host], deploy["results"][host]
        assert bench.rc == 0, bench.stdout
        # --limit: each run touched its own host only, and says which model it measured.
        assert set(bench.stats["ok"]) - {"localhost"} == {host}, bench.stats
        run = json.loads((results / "run.json").read_text())
        assert run["hosts"] == [host] and run["model"]["name"] == MODELS[host]
        assert run["model"]["attention"] == model(MODELS[host])["attention"]
        assert sorted(p.name for p in results.iterdir() if p.is_dir()) == [host]
        for config in CONFIGS[host]:
            for concurrency in LEVELS:
                level = json.loads(
                    (results / host / config / "questions" / f"c{concurrency}.json").read_text()
                )
                assert level["summary"]["requests_ok"] == PROMPTS, (host, config, concurrency)
                python = "venv-git" if config in (CHAIN, *DDTREE_CONFIGS[host]) else "venv"
                assert level["provenance"]["launch"]["argv"][0] == f"/opt/kimi/{python}/bin/python"


def test_analysis_report_shows_the_speedup_the_simulator_implies(deploy, tmp_path):
    from tests.support.report_check import check_report, open_in_chromium

    for host in HOSTS:
        analysis, report = deploy["analysis"][host], deploy["reports"][host]
        assert analysis.returncode == 0, analysis.stdout + analysis.stderr
        check_report(report)
    with (deploy["reports"][KIMI_HOST] / "summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    dflash = [r for r in rows if r["config"] == "dflash"]
    assert {(r["host"], r["concurrency"]) for r in dflash} == {
        (KIMI_HOST, level) for level in ("1", "4")
    }
    ar = Sim(step_ms=STEP_MS, prefill_ms=PREFILL_MS)
    spec = Sim(step_ms=STEP_MS, prefill_ms=PREFILL_MS, accept=float(ACCEPT))
    for row in dflash:
        # What the server counted is exact: ACCEPT tokens a verify step, the prefill token
        # aside. The speedup is the report's own ratio of measured throughputs; against the
        # simulator's implied range it is a timing, so it only has to be in its neighbourhood
        # (4 requests at 5 ms steps on a loaded 2-core machine overshoot by several percent).
        assert float(row["accepted_tokens_per_step"]) == pytest.approx(ACCEPT, rel=0.01), row
        reference = next(
            r for r in rows if r["config"] == "ar" and r["concurrency"] == row["concurrency"]
        )
        measured = float(row["output_tokens_per_s"]) / float(reference["output_tokens_per_s"])
        assert float(row["speedup_vs_ar"]) == pytest.approx(measured, rel=0.01), row
        low, high = implied_speedup_range(
            spec, ar, int(row["concurrency"]), PROMPTS, MAX_NEW_TOKENS
        )
        assert low * 0.85 <= float(row["speedup_vs_ar"]) <= high * 1.15, (low, high, row)
    # The hybrid run's report, as a browser shows it (the comparison's page is opened below).
    shown = open_in_chromium(deploy["reports"][QWEN_HOST] / "report.html", tmp_path)
    assert shown["images"] and all(complete for complete, *_ in shown["images"])


def test_ddtree_sweep_runs_with_its_flags_and_is_diagnosed_per_host(deploy):
    """Every budget of each model ran on the git runtime with the flags DDTree needs; each
    run's report shows every budget beside its chain control, warns about the hybrid's collapse
    only, and never recommends a collapsed budget."""
    documents = {}
    for host in HOSTS:
        results, report = deploy["results"][host], deploy["reports"][host]
        assert deploy["analysis"][host].returncode == 0, deploy["analysis"][host].stderr
        scaled = {b: (step * STEP_SCALE, accept) for b, (step, accept) in SWEEPS[host].items()}
        assert set(BUDGETS[host]) <= set(scaled), (host, sorted(scaled))
        for budget in BUDGETS[host]:
            for concurrency in LEVELS:
                level = json.loads(
                    (
                        results / host / f"ddtree-b{budget}" / "questions" / f"c{concurrency}.json"
                    ).read_text()
                )
                argv = " ".join(level["provenance"]["launch"]["argv"])
                for flags in (
                    "--speculative-algorithm DDTREE",
                    f"--speculative-ddtree-budget {budget}",
                    f"--speculative-num-draft-tokens {block_size(host)}",
                    "--page-size 1",
                    "--disable-overlap-schedule",
                    "--attention-backend triton",
                ):
                    assert flags in argv, (host, budget, flags, argv)
                # The simulator's table, read back through the client: tokens a verify step.
                measured = level["summary"]["accepted_tokens_per_step"]
                assert measured == pytest.approx(scaled[budget][1], rel=0.05), (host, budget)

        document = json.loads((report / "report.json").read_text())
        documents[host] = document
        rows = [r for r in document["rows"] if r["prompt_set"] == "questions"]
        assert {r["host"] for r in rows} == {host}
        block = block_size(host)  # K2.6 8, Qwen 16
        for row in rows:
            budget = row["ddtree_budget"]
            expected = {"ar": 1, "dflash": block, CHAIN: block}.get(
                row["config"], (budget or 0) + 1
            )
            assert int(row["verify_tokens_per_step"]) == expected, row
            if row["config"].startswith("ddtree-"):
                assert row["chain_control"] == CHAIN, row
                chain = next(
                    r
                    for r in rows
                    if (r["config"], r["concurrency"]) == (CHAIN, row["concurrency"])
                )
                ratio = row["output_tokens_per_s"] / chain["output_tokens_per_s"]
                assert row["speedup_vs_chain"] == pytest.approx(ratio, rel=1e-3), row
        shown = {(r["host"], r["config"], int(r["concurrency"])) for r in rows}
        assert shown >= {(host, c, n) for c in CONFIGS[host] for n in LEVELS}

    collapses = {
        host: [w for w in document["warnings"] if w["kind"] == "ddtree_budget_collapse"]
        for host, document in documents.items()
    }
    assert collapses[KIMI_HOST] == []
    assert sorted(
        (w["host"], w["prompt_set"], int(w["concurrency"])) for w in collapses[QWEN_HOST]
    ) == [(QWEN_HOST, "questions", level) for level in LEVELS]
    # The simulator's collapse pairs, found again from what the client measured: 15 -> 32 and
    # 32 -> 64, the published study's two steps.
    expected_pairs = [(a, b) for a, b, kind in pairs(QWEN_HYBRID) if kind == "collapse"]
    assert expected_pairs == [(15, 32), (32, 64)]
    for warning in collapses[QWEN_HOST]:
        found = [(p["budgets"][0], p["budgets"][1]) for p in warning["pairs"]]
        assert found == expected_pairs, warning
    rows = [r for d in documents.values() for r in d["rows"] if r["prompt_set"] == "questions"]
    collapsed = {
        (r["host"], r["ddtree_budget"]) for r in rows if r["budget_diagnosis"] == "collapsed"
    }
    assert collapsed == {(QWEN_HOST, budget) for budget in (32, 64)}
    saturated = {
        (r["host"], r["ddtree_budget"]) for r in rows if r["budget_diagnosis"] == "saturated"
    }
    # The healthy sweep gains under 5% tokens a step from 64 to 128 for 11% more step time.
    assert saturated == {(KIMI_HOST, 128)}
    picks: dict[str, dict] = {}
    for document in documents.values():
        for pick in document["recommendation"]:
            picks.setdefault(pick["host"], {})[pick["band"]] = pick
    assert set(picks) == set(HOSTS)
    # The hybrid: only budget 15 stayed healthy, and it is the fastest config there (15 tokens
    # a step against the chain control's 12 at almost its step time, 20% ahead).
    assert {p["config"] for p in picks[QWEN_HOST].values()} == {"ddtree-b15"}
    # The healthy host: 32 and 64 run within about 1% of each other, 7% or more ahead of
    # everything else, so the pick is one of them. Which one is the saturation rule's call on
    # each band's own figures: 32 when its 64 -> 128 step saturated and 32 measured within
    # NEAR_BEST of the fastest, else the fastest. A level here lasts a second or less, so
    # a stall of a loaded 2-core machine can move one budget's figure past the 3% margin or
    # blur one level's 64 -> 128 step rise (CI once picked 64 at one level); the rule itself,
    # on fixed figures, is tests/unit/test_analysis.py's.
    assert len(picks[KIMI_HOST]) == len(LEVELS), picks[KIMI_HOST]
    for band, pick in picks[KIMI_HOST].items():
        levels = {int(level) for level in pick["levels"].split(", ")}
        inside = [r for r in rows if r["host"] == KIMI_HOST and int(r["concurrency"]) in levels]
        speed = {r["config"]: r["output_tokens_per_s"] for r in inside}
        fastest = max(speed, key=speed.get)
        assert fastest in ("ddtree-b32", "ddtree-b64"), (band, speed)
        saturates = any(r["budget_diagnosis"] == "saturated" for r in inside)
        # The analysis's rule (analysis/recommend.py): saturated, the smallest budget within
        # NEAR_BEST of the fastest; b16 can come within it on a loaded machine.
        near = [
            f"ddtree-b{b}"
            for b in sorted(BUDGETS[KIMI_HOST])
            if speed.get(f"ddtree-b{b}", 0) >= (1 - NEAR_BEST) * speed[fastest]
        ]
        expected = near[0] if saturates and near else fastest
        assert pick["config"] == expected, (band, saturates, speed, pick)
        if pick["config"] != fastest:
            assert "the budget sweep saturates (b64 -> b128" in pick["note"], pick


def test_comparison_of_the_two_models_shows_both_decompositions_and_the_hybrids_collapse(
    deploy, tmp_path
):
    """`python -m analysis compare RUN_K26 RUN_QWEN`: the hybrid (B) carries the collapse
    warnings and a collapsed verdict, K2.6 (A) none and a healthy one, and the page shows each
    run's decomposition plot."""
    from tests.support.report_check import open_in_chromium, png_size

    analysis, out = deploy["analysis"]["compare"], deploy["compare"]
    assert analysis.returncode == 0, analysis.stdout + analysis.stderr
    document = json.loads((out / "report.json").read_text())
    assert document["kind"] == "analysis.compare"
    collapses = [w for w in document["warnings"] if w["kind"] == "ddtree_budget_collapse"]
    assert sorted((w["where"][:2], w["host"], int(w["concurrency"])) for w in collapses) == [
        ("B:", QWEN_HOST, level) for level in LEVELS
    ]
    diagnosis = document["diagnosis"]
    assert diagnosis["a"]["model"]["name"] == MODELS[KIMI_HOST]
    assert diagnosis["b"]["model"]["name"] == MODELS[QWEN_HOST]
    assert (diagnosis["a"]["verdict"], diagnosis["b"]["verdict"]) == ("healthy", "collapsed")
    assert diagnosis["a"]["collapses"] == []
    assert len(diagnosis["b"]["collapses"]) == len(LEVELS)
    # Both runs' budget steps, each against its own next budget.
    steps = {
        side: {tuple(row["budgets"]) for row in diagnosis[side]["ddtree_sweep"]}
        for side in ("a", "b")
    }
    assert steps == {"a": {(16, 32), (32, 64), (64, 128)}, "b": {(15, 32), (32, 64)}}
    # Hosts differ and so do some configs: what both ran (ar, the chain, b32, b64) is side by
    # side, each run's other configs listed as only in it.
    configs = {row["config"] for row in document["rows"]}
    assert configs == {"ar", CHAIN, "ddtree-b32", "ddtree-b64"}
    assert {entry[1] for entry in document["only_in_a"]} == {"dflash", "ddtree-b16", "ddtree-b128"}
    assert {entry[1] for entry in document["only_in_b"]} == {"ddtree-b15"}
    decompositions = [p for p in document["plots"] if "decomposition" in p]
    assert len(decompositions) == 2, document["plots"]
    for name in decompositions:
        width, height = png_size((out / name).read_bytes())
        assert width > 200 and height > 150, (name, width, height)
    page = (out / "compare.html").read_text()
    assert page.count("data:image/png;base64,") == len(document["plots"])
    shown = open_in_chromium(out / "compare.html", tmp_path)
    assert len(shown["images"]) == len(document["plots"])
    assert all(complete and width > 200 for complete, width, _ in shown["images"])


def test_second_deploy_changes_nothing_and_keeps_the_servers(cluster, deploy):
    first, second = deploy["first"], deploy["second"]
    assert first.rc == 0, first.stdout
    second.assert_unchanged()
    # The benchmark ends by starting the deploy's config again; deploy leaves it running.
    pids = {name: server_pid(cluster, name) for name in HOSTS}
    assert pids == deploy["pids_after_benchmark"]
    actions = second.results("Start the server, restarting it only when its launch changed")
    assert {actions[h]["action"] for h in HOSTS} == {"none"}


def test_plan_lists_what_deploy_runs(cluster, deploy):
    """Each model's plan goes to its own folder (K2.6's where it always did, Qwen's under
    qwen3.6-27b/), and each lists the launch its host runs."""
    from tests.support.ansible_run import run_playbook

    extravars = deploy["extravars"]
    # Kept for the secrets scan, which reads what plan wrote as well.
    plan_dir = deploy["report_dir"] / "plan"
    (deploy["report_dir"] / "plan-runner").mkdir()
    run = run_playbook(
        "plan.yml",
        cluster.inventory,
        deploy["report_dir"] / "plan-runner",
        extravars={
            **extravars,
            "plan_output_dir": moved("kimi_plan_dir", "plan", str(plan_dir)),
            "plan_state_dir": extravars["weights_controller_state_dir"],
        },
        vars_files=[deploy["key_file"]],
        # The token the deploy had: the plan asks the hub for the gated drafters as it did.
        envvars={**token_env(TOKEN, deploy["secrets"]), "HF_HUB_DISABLE_XET": "1"},
    )
    assert run.rc == 0, run.stdout
    folders = {KIMI_HOST: plan_dir / KIMI_HOST, QWEN_HOST: plan_dir / MODELS[QWEN_HOST] / QWEN_HOST}
    assert sorted(p.name for p in plan_dir.iterdir()) == sorted([KIMI_HOST, MODELS[QWEN_HOST]])
    for host, folder in folders.items():
        plan = json.loads((folder / "plan.json").read_text())
        launches = {c["name"]: c for c in plan["serving_configs"]["dflash"]["launch"]}
        deployed = json.loads(cluster.ssh(host, "cat /var/lib/kimi/server/launch.json").stdout)
        assert launches["dflash"]["argv"] == deployed["argv"]
        # The deploy adds the runtime version's folder (known once the runtime is built).
        environment = dict(deployed["environment"])
        assert environment.pop("KIMI_RUNTIME_DIR").startswith("/opt/kimi/runtimes/release-")
        assert launches["dflash"]["environment"] == environment
        # The budgets each model sweeps, as its plan lists them.
        ddtree = {c["name"] for c in plan["serving_configs"]["ddtree"]["launch"]}
        assert ddtree == set(DDTREE_CONFIGS[host]), (host, ddtree)


def test_no_secret_reaches_a_file_others_can_read(cluster, deploy):
    """The HF token and the API key, and anything anyone can compute from them (unkeyed hashes,
    base64, the server's old launch hash), are in no file readable by other users: not on the
    controller (ansible-runner's records of every run, results, reports, plans, the controller
    state) and not on the hosts (everything they wrote, journals included). Root-only files are
    where secrets belong; the files the secrets came from are excepted."""
    from tests.support.secret_scan import derived_forms, legacy_launch_hash, scan

    assert deploy["first"].rc == 0, deploy["first"].stdout
    secrets = {"HF token": derived_forms(TOKEN), "API key": derived_forms(API_KEY)}
    for host in HOSTS:
        launch = json.loads(cluster.ssh(host, "cat /var/lib/kimi/server/launch.json").stdout)
        old = legacy_launch_hash(launch["argv"], launch["environment"], API_KEY)
        secrets["API key"][f"old launch hash ({host})"] = old.encode()
    # The API key did reach the hosts, and only into root-only files, root's also on the host
    # the run reached as the sudo user; the HF token's file went with the download.
    root_only = ["/etc/kimi/sglang-secrets.yaml", "/etc/kimi/kimi-sglang.env"]
    for host in HOSTS:
        owners = cluster.ssh(host, f"stat -c '%n %U %a' {' '.join(root_only)}").stdout
        assert owners.split() == [f for path in root_only for f in (path, "root", "600")], (
            host,
            owners,
        )
        token_file = cluster.ssh(host, "ls /opt/kimi/weights/.kimi/hf-token", check=False)
        assert token_file.returncode != 0, (host, token_file.stdout)
    controller = [
        *(deploy[name].private_dir for name in ("first", "second")),
        *(run.private_dir for run in deploy["bench"].values()),
        *deploy["results"].values(),
        deploy["report_dir"],
        deploy["state_root"],
    ]
    hosts = [Path(host.state_dir) / part for host in cluster.hosts for part in ("upper", "tmp")]
    leaks, read = scan(controller + hosts, secrets, exclude=[deploy["secrets"]])
    assert read > 200, f"only {read} files were read: the scan looked in the wrong places"
    assert not leaks, "\n".join(map(str, leaks))
    # The K2.6 host's canary records, logs and sources hold no trace of the token, readable by
    # others or not (its checkpoints are the generator's random bytes), nor does the output.
    canary = Path(cluster.host(KIMI_HOST).state_dir) / "upper/opt/kimi/canary"
    tops = [canary / "logs", canary / "sources"]
    leaks, read = scan(tops, {"HF token": secrets["HF token"]}, readable_only=False)
    assert read > 20 and not leaks, "\n".join(map(str, leaks))
    assert TOKEN.encode() not in (canary / "canary.json").read_bytes()
    for run in (deploy["first"], deploy["second"]):
        assert TOKEN not in run.stdout
    # The server logged its resolved arguments, the API key among them, as SGLang does: into
    # its root-only log file on both hosts, never into the systemd host's journal.
    for host in HOSTS:
        logged = cluster.ssh(host, f"grep -c -F -e {API_KEY} /var/log/kimi/sglang.log").stdout
        assert int(logged) > 0, host
    journal = cluster.ssh(SYSTEMD_HOST, "journalctl --no-pager -o cat", timeout=60).stdout
    assert "Started kimi-sglang.service" in journal
    assert API_KEY not in journal
    # What lives only inside the hosts (their own /run: pid files, the systemd journal).
    for host in HOSTS:
        found = cluster.ssh(
            host,
            "find /run -xdev -type f \\( -perm -o=r -o -perm -g=r \\) -print0 "
            f"| xargs -0r grep -l -a -i -F -e {TOKEN} -e {API_KEY} || true",
        ).stdout.split()
        assert not found, (host, found)


# The simulator's line once it serves (its loading line says "before serving on" too).
SERVING = re.compile(r"^simulated sglang \S+ serving on ")
DEBUG_FILES = {
    "collected.json",
    "dmesg.txt",
    "nccl.txt",
    "nvidia-smi-q-start.txt",
    "nvidia-smi-q-end.txt",
    "runtime.json",
    "launch.json",
}


def test_each_config_brings_back_its_debug_files_and_the_bundle_holds_no_secret(deploy, tmp_path):
    """Per host and config the benchmark fetched what debugging a result needs (the server's
    log whole on the supervised host, its unit's journal on the systemd host), and `analysis
    bundle` of each run packs it with no secret in it, gzip members included."""
    import gzip

    from tests.support.secret_scan import derived_forms, scan

    secrets = {"HF token": derived_forms(TOKEN), "API key": derived_forms(API_KEY)}
    for host in HOSTS:
        results = deploy["results"][host]
        # Both managers write the server's log file; the unit's journal holds systemd's lines.
        log = {"server.log.gz", "journal.txt.gz"} if host == SYSTEMD_HOST else {"server.log.gz"}
        for config in CONFIGS[host]:
            debug = results / host / config / "debug"
            assert {p.name for p in debug.iterdir()} == DEBUG_FILES | log, (host, config)
            collected = json.loads((debug / "collected.json").read_text())
            assert collected["kind"] == "kimi.benchmark_debug", collected
            # The config's own lines: its server's start, and not the launch of another config.
            text = gzip.decompress((debug / "server.log.gz").read_bytes()).decode()
            started = [line for line in text.splitlines() if SERVING.match(line)]
            assert len(started) == 1, (host, config, started)
            if host == SYSTEMD_HOST:
                # The unit's journal for the window: systemd's lines, none of the server's.
                journal = gzip.decompress((debug / "journal.txt.gz").read_bytes()).decode()
                assert "kimi-sglang" in journal and "server_args=" not in journal, (host, config)
            assert "Driver Version" in (debug / "nvidia-smi-q-end.txt").read_text()
        bundle = tmp_path / f"{host}.tar.gz"
        packed = subprocess.run(
            [
                sys.executable,
                "-m",
                "analysis",
                "bundle",
                str(results),
                "--out",
                str(bundle),
                "--secret-env",
                "KIT_TEST_API_KEY",
            ],
            cwd=REPO,
            env={**os.environ, "KIT_TEST_API_KEY": API_KEY, "HF_TOKEN": TOKEN},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert packed.returncode == 0, packed.stdout + packed.stderr
        assert API_KEY not in packed.stdout + packed.stderr
        unpacked = tmp_path / f"{host}-unpacked"
        extract_files(bundle, unpacked)
        names = {p.relative_to(unpacked).as_posix() for p in unpacked.rglob("*") if p.is_file()}
        for config in CONFIGS[host]:
            for name in DEBUG_FILES | log:
                assert f"{results.name}/{host}/{config}/debug/{name}" in names, (config, name)
        for member in list(unpacked.rglob("*.gz")):
            member.with_suffix("").write_bytes(gzip.decompress(member.read_bytes()))
        leaks, read = scan([unpacked], secrets, readable_only=False)
        assert read > 20 and not leaks, "\n".join(map(str, leaks))


def test_systemd_runs_the_fabric_manager_and_restarts_a_killed_server(cluster, deploy):
    """Last: it kills the b200 host's server."""
    first = deploy["first"]
    assert first.rc == 0, first.stdout
    shown = first.results("Show the launch")
    assert shown[SYSTEMD_HOST]["msg"]["manager"] == "systemd"
    assert shown["ct200-a"]["msg"]["manager"] == "supervisor"

    def show(unit: str, *properties: str) -> dict:
        out = cluster.ssh(SYSTEMD_HOST, f"systemctl show {unit} -p {','.join(properties)}")
        return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)

    # The tuning stage enabled and started the fabric manager's unit, which the package leaves
    # disabled.
    assert show("nvidia-fabricmanager", "ActiveState", "UnitFileState") == {
        "ActiveState": "active",
        "UnitFileState": "enabled",
    }
    before = show("kimi-sglang", "MainPID", "NRestarts", "ActiveState", "UnitFileState")
    assert before["ActiveState"] == "active" and before["UnitFileState"] == "enabled"
    cluster.ssh(SYSTEMD_HOST, f"kill -9 {before['MainPID']}")
    deadline = time.monotonic() + 60
    after = before
    while time.monotonic() < deadline:
        after = show("kimi-sglang", "MainPID", "NRestarts", "ActiveState")
        if after["ActiveState"] == "active" and after["MainPID"] not in ("0", before["MainPID"]):
            break
        time.sleep(0.5)
    assert int(after["NRestarts"]) == int(before["NRestarts"]) + 1, after
    assert after["MainPID"] not in ("0", before["MainPID"]), after
    said = cluster.ssh(SYSTEMD_HOST, "journalctl -u kimi-sglang --no-pager -o cat").stdout
    assert "Main process exited, code=killed, status=9/KILL" in said
