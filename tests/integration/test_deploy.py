"""The whole study end to end over SSH test hosts, a PCIe ct200 host and an NVSwitch b200 host
at once: deploy_kimi.yml (preflight, weights from a local hub, the release runtime with the
simulator packaged as sglang 0.5.23 and the git runtime built from a local copy of the DDTree
pull request's ref, tuning with kernel values under a private tree, the server), then
benchmark_kimi.yml (ar, dflash, the chain control dflash-tree-backend and DDTree at the default
budgets 16, 32, 64 and 128, at two levels), then `python -m analysis report`; a second deploy
changes nothing and does not restart the servers; plan.yml lists what deploy ran.

The simulator plays a DDTree budget sweep per host from tests/support/ddtree_tables.py: the ct200
host a healthy pure-attention one (accepted tokens per step rising, then saturating), the b200 host
one shaped like the hybrid model's collapse, so the report must warn about the second only.

The b200 host boots systemd as PID 1, as real GPU hosts do: its fabric manager and its server
are systemd units. The ct200 host runs sshd as PID 1 (a container): the kit's supervisor runs
its server."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.ddtree_tables import HEALTHY, HYBRID_COLLAPSE, pairs, table_env
from tests.support.fake_sglang import build_git_source
from tests.support.hostprep import EXTRAVARS as TUNING_VARS
from tests.support.hostprep import install_fabricmanager, install_git_source, prepare_host
from tests.support.hub_server import LocalHub, token_env
from tests.support.results_tree import TEMPLATE, Sim, implied_speedup_range

REPO = Path(__file__).resolve().parents[2]
# The first test carries the whole deploy, benchmark and report (its fixture): about 8 minutes
# alone, more while other test files run beside it under make test.
pytestmark = [pytest.mark.runtime, pytest.mark.integration, pytest.mark.timeout(1500)]

TOKEN = "hf_deploy_good_2b7e41"
# The server's API key, handed over as a vault-like vars file (never as extra vars, which
# ansible-runner writes into its own env/extravars).
API_KEY = "sk-kimi-e2e-7f3a9c51e2d4"
HOSTS = ["ct200-a", "b200-a"]
SYSTEMD_HOST = "b200-a"
RUN = "e2e"
# The simulator's settings: 5 ms steps, 4 tokens accepted per verify step under speculation,
# next to no prefill, so dflash over ar is close to 4x by construction (256 tokens: the prefill
# token, then 255 decode steps against 64 verify steps).
STEP_MS, ACCEPT, MAX_NEW_TOKENS, PREFILL_MS, PROMPTS = 5, 4, 256, 1, 8
SIM_ENV = {
    "HF_HUB_OFFLINE": "1",
    "SGLANG_SIM_LOAD_SECONDS": "2",
    "SGLANG_SIM_STEP_MS": str(STEP_MS),
    "SGLANG_SIM_ACCEPT": str(ACCEPT),
    "SGLANG_SIM_PREFILL_MS": str(PREFILL_MS),
}
# DDTree per budget: a healthy sweep on one host, the hybrid-shaped collapse on the other. Step
# times shrink to a fifth (about 6 ms a step) so the sweep runs quickly; the diagnosis reads
# ratios between budgets, which the scale keeps.
SWEEPS = {"ct200-a": HEALTHY, SYSTEMD_HOST: HYBRID_COLLAPSE}
STEP_SCALE = 0.2
BUDGETS = [16, 32, 64, 128]  # kimi_ddtree_budgets' defaults
DDTREE_CONFIGS = [f"ddtree-b{budget}" for budget in BUDGETS]
CHAIN = "dflash-tree-backend"
# The chain control: DFlash's chain on the tree backend, a little faster a step than the
# smallest tree and accepting fewer tokens.
CHAIN_ENV = {"SGLANG_SIM_STEP_MS": "5.8", "SGLANG_SIM_ACCEPT": "4.4"}
CONFIGS = ["ar", "dflash", CHAIN, *DDTREE_CONFIGS]
LEVELS = (1, 4)


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
        # Host variables, so each host's simulator plays its own sweep (extra vars would win).
        hosts.write_inventory(
            host_vars={name: {"kimi_server_environment": host_environment(name)} for name in HOSTS}
        )
        yield hosts
    finally:
        hosts.down()


@pytest.fixture(scope="module")
def hub(cluster):
    with LocalHub(host=cluster.gateway) as hub:
        hub.valid_tokens.add(TOKEN)
        shards = {f"model-{i:05d}-of-00004.safetensors": bytes([i]) * 400_000 for i in range(4)}
        hub.add_repo(
            "moonshotai/Kimi-K2.6",
            {
                "config.json": (REPO / "models/kimi-k2.6/config.json").read_bytes(),
                # The benchmark renders prompts through the model's own chat template.
                "tokenizer_config.json": json.dumps({"chat_template": TEMPLATE}).encode(),
                **shards,
            },
        )
        hub.add_repo(
            "z-lab/Kimi-K2.6-DFlash",
            {"config.json": b'{"block_size": 8}', "model.safetensors": b"d" * 200_000},
            gated=True,
            approved_tokens={TOKEN},
        )
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
    extravars = {
        **TUNING_VARS,
        "kimi_serving_configs": ["ar", "dflash", "ddtree"],
        "kimi_server_config": "dflash",
        # Beyond loopback, so the API key is in force (on loopback the kit sets none).
        "kimi_server_host": "0.0.0.0",  # noqa: S104 - inside the test host's own namespace
        "kimi_hf_endpoint": hub.url,
        "kimi_sglang_git": {"url": git["url"], "ref": git["ref"], "patches": []},
        "weights_controller_state_dir": str(Path(cluster.state_dir) / "controller-state"),
        "weights_wheelhouse": str(wheelhouse),
        "weights_poll_interval": 1,
        "weights_download_environment": {"HF_HUB_DISABLE_XET": "1"},
        "runtime_wheelhouse": str(runtime_wheelhouse),
        "server_health_poll_s": 1,
    }

    def run(name: str, playbook: str = "deploy_kimi.yml", **more):
        return run_playbook(
            playbook,
            cluster.inventory,
            tmp_path_factory.mktemp(name),
            extravars={**extravars, **more},
            envvars={**token_env(TOKEN, secrets), "HF_HUB_DISABLE_XET": "1"},
            vars_files=[key_file],
        )

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
    bench = run(
        "benchmark",
        "benchmark_kimi.yml",
        benchmark_concurrency=list(LEVELS),
        benchmark_server_environment={CHAIN: CHAIN_ENV},
        benchmark_num_prompts=PROMPTS,
        benchmark_max_new_tokens=MAX_NEW_TOKENS,
        benchmark_warmup_requests=1,
        benchmark_poll_s=1,
        benchmark_run_id=RUN,
        benchmark_results_dir=str(results),
        benchmark_prompt_sets=[],
        benchmark_prompt_files={"questions": str(prompts)},
    )
    report = tmp_path_factory.mktemp("report") / "out"
    analysis = subprocess.run(
        [sys.executable, "-m", "analysis", "report", str(results / RUN), "--out", str(report)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    pids_after_benchmark = {name: server_pid(cluster, name) for name in HOSTS}
    second = run("deploy-2")
    return {
        "secrets": secrets,
        "key_file": key_file,
        "report_dir": report.parent,
        "first": first,
        "second": second,
        "pids": pids,
        "pids_after_benchmark": pids_after_benchmark,
        "bench": bench,
        "results": results / RUN,
        "analysis": analysis,
        "report": report,
        "extravars": extravars,
    }


def server_pid(cluster, host: str) -> int:
    if host == SYSTEMD_HOST:
        return int(cluster.ssh(host, "systemctl show -p MainPID --value kimi-sglang").stdout)
    state = cluster.ssh(host, "cat /var/lib/kimi/server/kimi-sglang.state.json").stdout
    return int(json.loads(state)["child_pid"] or 0)


def test_deploy_ends_with_a_healthy_server_on_every_host(cluster, deploy):
    first = deploy["first"]
    assert first.rc == 0, first.stdout
    health = first.results("Wait for /health_generate")
    assert {host: health[host]["state"] for host in HOSTS} == dict.fromkeys(HOSTS, "healthy")
    for host in HOSTS:
        launch = json.loads(cluster.ssh(host, "cat /var/lib/kimi/server/launch.json").stdout)
        assert launch["config"] == "dflash" and launch["runtime"] == "sglang==0.5.23"
        assert launch["argv"][0] == "/opt/kimi/venv/bin/python"
        assert "/opt/kimi/weights/z-lab/Kimi-K2.6-DFlash" in launch["argv"]
        # The profile's NCCL settings reach the server and /etc/nccl.conf alike.
        nccl = cluster.ssh(host, "cat /etc/nccl.conf").stdout
        for key, value in launch["environment"].items():
            if key.startswith("NCCL_"):
                assert f"{key}={value}" in nccl
    ct200 = json.loads(cluster.ssh("ct200-a", "cat /var/lib/kimi/server/launch.json").stdout)
    assert ct200["environment"]["NCCL_P2P_DISABLE"] == "1"
    b200 = json.loads(cluster.ssh("b200-a", "cat /var/lib/kimi/server/launch.json").stdout)
    argv = b200["argv"]
    assert argv[argv.index("--attention-backend") + 1] == "trtllm_mla"


def test_benchmark_lands_results_for_every_host_config_and_level(deploy):
    bench, results = deploy["bench"], deploy["results"]
    assert bench.rc == 0, bench.stdout
    for host in HOSTS:
        for config in CONFIGS:
            for concurrency in LEVELS:
                level = json.loads(
                    (results / host / config / "questions" / f"c{concurrency}.json").read_text()
                )
                assert level["summary"]["requests_ok"] == PROMPTS, (host, config, concurrency)
                python = "venv-git" if config in (CHAIN, *DDTREE_CONFIGS) else "venv"
                assert level["provenance"]["launch"]["argv"][0] == f"/opt/kimi/{python}/bin/python"


def test_analysis_report_shows_the_speedup_the_simulator_implies(deploy, tmp_path):
    from tests.support.report_check import check_report, open_in_chromium

    analysis, report = deploy["analysis"], deploy["report"]
    assert analysis.returncode == 0, analysis.stdout + analysis.stderr
    check_report(report)
    with (report / "summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    dflash = [r for r in rows if r["config"] == "dflash"]
    assert {(r["host"], r["concurrency"]) for r in dflash} == {
        (host, level) for host in HOSTS for level in ("1", "4")
    }
    ar = Sim(step_ms=STEP_MS, prefill_ms=PREFILL_MS)
    spec = Sim(step_ms=STEP_MS, prefill_ms=PREFILL_MS, accept=float(ACCEPT))
    for row in dflash:
        # ACCEPT tokens per verify step against one per step, at the same step time.
        low, high = implied_speedup_range(
            spec, ar, int(row["concurrency"]), PROMPTS, MAX_NEW_TOKENS
        )
        assert low * 0.95 <= float(row["speedup_vs_ar"]) <= high * 1.05, (low, high, row)
    shown = open_in_chromium(report / "report.html", tmp_path)
    assert shown["images"] and all(complete for complete, *_ in shown["images"])


def test_ddtree_sweep_runs_with_its_flags_and_is_diagnosed_per_host(deploy):
    """Every budget ran on the git runtime with the flags DDTree needs; the report shows every
    budget beside its chain control, warns about the collapse-shaped sweep only, and never
    recommends a collapsed budget."""
    results, report = deploy["results"], deploy["report"]
    assert deploy["analysis"].returncode == 0, deploy["analysis"].stderr
    for host in HOSTS:
        scaled = {b: (step * STEP_SCALE, accept) for b, (step, accept) in SWEEPS[host].items()}
        for budget in BUDGETS:
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
                    "--page-size 1",
                    "--disable-overlap-schedule",
                    "--attention-backend triton",
                ):
                    assert flags in argv, (host, budget, flags, argv)
                # The simulator's table, read back through the client: tokens a verify step.
                measured = level["summary"]["accepted_tokens_per_step"]
                assert measured == pytest.approx(scaled[budget][1], rel=0.05), (host, budget)

    document = json.loads((report / "report.json").read_text())
    rows = [r for r in document["rows"] if r["prompt_set"] == "questions"]
    for row in rows:
        budget = row["ddtree_budget"]
        expected = {"ar": 1, "dflash": 8, CHAIN: 8}.get(row["config"], (budget or 0) + 1)
        assert int(row["verify_tokens_per_step"]) == expected, row
        if row["config"].startswith("ddtree-"):
            assert row["chain_control"] == CHAIN, row
            chain = next(
                r
                for r in rows
                if (r["host"], r["config"], r["concurrency"])
                == (row["host"], CHAIN, row["concurrency"])
            )
            ratio = row["output_tokens_per_s"] / chain["output_tokens_per_s"]
            assert row["speedup_vs_chain"] == pytest.approx(ratio, rel=1e-3), row
    shown = {(r["host"], r["config"], int(r["concurrency"])) for r in rows}
    assert shown >= {(h, c, n) for h in HOSTS for c in CONFIGS for n in LEVELS}

    collapses = [w for w in document["warnings"] if w["kind"] == "ddtree_budget_collapse"]
    assert sorted((w["host"], w["prompt_set"], int(w["concurrency"])) for w in collapses) == [
        (SYSTEMD_HOST, "questions", level) for level in LEVELS
    ]
    # The simulator's collapse pairs, found again from what the client measured.
    expected_pairs = [(a, b) for a, b, kind in pairs(HYBRID_COLLAPSE) if kind == "collapse"]
    for warning in collapses:
        found = [(p["budgets"][0], p["budgets"][1]) for p in warning["pairs"]]
        assert [pair for pair in found if pair[1] in BUDGETS] == [
            pair for pair in expected_pairs if pair[1] in BUDGETS
        ], warning
    # 32 and 64 fell from the budget below; 128 stays far below 16 for no more step time.
    collapsed = {
        (r["host"], r["ddtree_budget"]) for r in rows if r["budget_diagnosis"] == "collapsed"
    }
    assert collapsed == {(SYSTEMD_HOST, budget) for budget in (32, 64, 128)}
    saturated = {
        (r["host"], r["ddtree_budget"]) for r in rows if r["budget_diagnosis"] == "saturated"
    }
    # The healthy sweep gains under 5% tokens a step from 64 to 128 for 11% more step time.
    assert saturated == {("ct200-a", 128)}
    picks: dict[str, set] = {}
    for pick in document["recommendation"]:
        picks.setdefault(pick["host"], set()).add(pick["config"])
    # The collapse host: only budget 16 stayed healthy, and it is the fastest config there.
    # The healthy host: 32 and 64 run within 1% of each other, and 32 is the smaller (the
    # saturation rule takes it even when 64 measures a hair faster).
    assert picks == {SYSTEMD_HOST: {"ddtree-b16"}, "ct200-a": {"ddtree-b32"}}


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
            "plan_output_dir": str(plan_dir),
            "plan_state_dir": extravars["weights_controller_state_dir"],
        },
        vars_files=[deploy["key_file"]],
    )
    assert run.rc == 0, run.stdout
    for host in HOSTS:
        plan = json.loads((plan_dir / host / "plan.json").read_text())
        launches = {c["name"]: c for c in plan["serving_configs"]["dflash"]["launch"]}
        deployed = json.loads(cluster.ssh(host, "cat /var/lib/kimi/server/launch.json").stdout)
        assert launches["dflash"]["argv"] == deployed["argv"]
        assert launches["dflash"]["environment"] == deployed["environment"]


def test_no_secret_reaches_a_file_others_can_read(cluster, deploy):
    """The HF token and the API key, and anything anyone can compute from them (unkeyed hashes,
    base64, the server's old launch hash), are in no file readable by other users: not on the
    controller (ansible-runner's records of every run, results, report, plan, the controller
    state) and not on the hosts (everything they wrote, journals included). Root-only files are
    where secrets belong; the files the secrets came from are excepted."""
    from tests.support.secret_scan import derived_forms, legacy_launch_hash, scan

    assert deploy["first"].rc == 0, deploy["first"].stdout
    secrets = {"HF token": derived_forms(TOKEN), "API key": derived_forms(API_KEY)}
    for host in HOSTS:
        launch = json.loads(cluster.ssh(host, "cat /var/lib/kimi/server/launch.json").stdout)
        old = legacy_launch_hash(launch["argv"], launch["environment"], API_KEY)
        secrets["API key"][f"old launch hash ({host})"] = old.encode()
    # The API key did reach the hosts, and only into root-only files.
    for host in HOSTS:
        mode = cluster.ssh(host, "stat -c %a /etc/kimi/sglang-secrets.yaml").stdout.strip()
        assert mode == "600", (host, mode)
    controller = [
        *(deploy[name].private_dir for name in ("first", "bench", "second")),
        deploy["results"],
        deploy["report_dir"],
        Path(deploy["extravars"]["weights_controller_state_dir"]),
    ]
    hosts = [Path(host.state_dir) / part for host in cluster.hosts for part in ("upper", "tmp")]
    leaks, read = scan(controller + hosts, secrets, exclude=[deploy["secrets"]])
    assert read > 200, f"only {read} files were read: the scan looked in the wrong places"
    assert not leaks, "\n".join(map(str, leaks))
    # What lives only inside the hosts (their own /run: pid files, the systemd journal).
    for host in HOSTS:
        found = cluster.ssh(
            host,
            "find /run -xdev -type f \\( -perm -o=r -o -perm -g=r \\) -print0 "
            f"| xargs -0r grep -l -a -i -F -e {TOKEN} -e {API_KEY} || true",
        ).stdout.split()
        assert not found, (host, found)


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
