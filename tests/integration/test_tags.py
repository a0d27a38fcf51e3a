"""Stage tags (issue 21 part 2) and the summaries the playbooks end with (part 4)."""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from tests.support.hub_server import LocalHub, add_kimi_repos, token_env

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.preflight, pytest.mark.integration]

STAGES = ["preflight", "runtime", "canary", "weights", "tuning", "server"]
TOKEN = "hf_tags_good_3b9e1f07"
LOCK_PLAYS = {"Take the per-host lock", "Release the per-host lock"}
# deploy_kimi.yml: one play takes each batch of hosts through every stage (issue 21 part 5).
ROLLING_PLAY = "Deploy Kimi K2.6 through every stage, a batch of hosts at a time"
DEPLOY_SUMMARY = "Say where the server answers and how to check it"


# Every root playbook the tag test reads, listed by one ansible-playbook: each start parses
# the whole kit again, and the listing says which playbook each play belongs to.
TAGGED_PLAYBOOKS = (
    "deploy_kimi.yml",
    "playbooks/weights.yml",
    "benchmark_kimi.yml",
    "plan.yml",
    "teardown.yml",
)


def list_tags(*playbooks: str) -> dict[str, dict[str, set[str]]]:
    """Per playbook, per play name, the task tags ansible-playbook --list-tags shows (no host
    is contacted)."""
    listed = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            *playbooks,
            "-i",
            "inventory/ct200",
            "--list-tags",
        ],
        cwd=REPO,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    found_tags: dict[str, dict[str, set[str]]] = {}
    plays: dict[str, set[str]] = {}
    play = None
    for line in listed.splitlines():
        if found := re.match(r"playbook: (.*)$", line.strip()):
            plays, play = found_tags.setdefault(found.group(1), {}), None
        elif found := re.match(r"\s*play #\d+ \([^)]*\): (.*?)\tTAGS:", line):
            play = found.group(1)
        elif (found := re.match(r"\s*TASK TAGS: \[(.*)\]", line)) and play:
            plays.setdefault(play, set()).update(t.strip() for t in found.group(1).split(",") if t)
    assert sorted(found_tags) == sorted(playbooks), listed
    return found_tags


def test_list_tags_shows_every_stage_and_the_lock_plays_stay_always():
    listed = list_tags(*TAGGED_PLAYBOOKS)
    plays = listed["deploy_kimi.yml"]
    # The speed calibration runs only when asked (--tags calibrate): `never` beside it.
    assert set().union(*plays.values()) == {"always", *STAGES, "router", "calibrate", "never"}
    # The router's lock plays are `always` beside their stage, as the rolling play's are.
    assert plays["Take the per-host lock of the router hosts"] == {"always", "router"}
    assert plays["Release the per-host lock of the router hosts"] == {"always", "router"}
    # A stage skipped with --skip-tags must not skip the lock's release (or its taking): the
    # stage playbooks' lock plays are `always` alone; deploy_kimi.yml's rolling play is shown
    # releasing under --tags preflight below.
    stage = listed["playbooks/weights.yml"]
    for name in LOCK_PLAYS:
        assert stage[name] == {"always"}, stage
    assert "server" in plays["Say where each server answers"]
    assert set().union(*listed["benchmark_kimi.yml"].values()) == {"always", "benchmark"}
    assert set().union(*listed["plan.yml"].values()) == {"always", "plan"}
    teardown = listed["teardown.yml"]
    assert set().union(*teardown.values()) == {"always", "teardown", "server", "tuning"}
    assert teardown["Restore the host values the tuning changed"] >= {"teardown", "tuning"}


def list_tasks(playbook: str, *args: str) -> list[str]:
    """The task lines ansible-playbook --list-tasks shows (no host is contacted)."""
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            playbook,
            "-i",
            "inventory/h200",
            "--list-tasks",
            *args,
        ],
        cwd=REPO,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()


def test_a_plain_deploy_never_calibrates_and_the_calibrate_tag_runs_the_calibration_alone():
    calibration = "tuning : Calibrate the speed model on this host's GPU"
    assert not [line for line in list_tasks("deploy_kimi.yml") if calibration in line]
    tagged = [line.strip() for line in list_tasks("deploy_kimi.yml", "--tags", "calibrate")]
    assert any(line.startswith(calibration) for line in tagged), tagged
    # Beside it only what every tag runs: the lock's tasks and the roles' argument checks.
    stages = [line for line in tagged if line.startswith(("preflight :", "weights :", "server :"))]
    assert all("Validating arguments" in line for line in stages), stages
    assert not any(line.startswith("tuning : Tune the host") for line in tagged), tagged


@pytest.fixture(scope="module")
def hub():
    with LocalHub() as hub:
        hub.valid_tokens.add(TOKEN)
        add_kimi_repos(hub, {TOKEN})
        yield hub


def test_deploy_with_tags_preflight_runs_preflight_alone(make_testhosts, playbook, hub, tmp_path):
    cluster = make_testhosts(["ct200"], names=["ct200-tags"])
    cluster.write_inventory()
    run = playbook(
        "deploy_kimi.yml",
        cluster.inventory,
        tags="preflight",
        extravars={"preflight_context_lengths_file": str(tmp_path / "context-lengths.json")},
        envvars={"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", **token_env(TOKEN, tmp_path)},
    )
    assert run.rc == 0 and not run.failed_hosts(), run.stdout[-8000:]
    judged = run.results("Judge every check")["ct200-tags"]
    assert judged["failures"] == [], judged
    ran = [
        (event["event"], event["event_data"])
        for event in run.events
        if event["event"] in ("runner_on_ok", "runner_on_skipped", "runner_on_failed")
    ]
    # Every task that ran belongs to the preflight role or to the rolling play's own tasks
    # (the lock's, the facts), but for Ansible's check of each role's arguments, which it tags
    # `always` (it reads variables on the controller and acts on nothing), and the settings
    # check's play before the batches (controller only, `always` too).
    stray = [
        (data.get("play"), data.get("role"), data.get("task"))
        for _, data in ran
        if (data.get("play") != ROLLING_PLAY or data.get("role") not in (None, "preflight"))
        and data.get("task_action") != "ansible.builtin.validate_argument_spec"
        and data.get("play") != "Check every host's settings before the first batch"
    ]
    assert stray == [], stray
    assert {data.get("task") for _, data in ran if data.get("role") == "preflight"} >= {
        "Gather GPU facts",
        "Judge every check",
    }
    # The batch's release runs although the server stage was not selected: no lock is left.
    releases = [kind for kind, data in ran if data.get("task") == "Release the per-host lock"]
    assert releases == ["runner_on_ok"], releases
    left = cluster.ssh("ct200-tags", "test -e /var/lib/kimi/lock/lock.json", check=False)
    assert left.returncode == 1, "the per-host lock was left on the host"


class KeyCheckingServer(http.server.BaseHTTPRequestHandler):
    """/v1/models for one Authorization header; what each request carried is kept."""

    expected = ""
    seen: ClassVar[list[str | None]] = []

    def do_GET(self):
        KeyCheckingServer.seen.append(self.headers.get("Authorization"))
        allowed = not self.expected or self.headers.get("Authorization") == self.expected
        body = json.dumps({"data": [{"id": "moonshotai/Kimi-K2.6"}]} if allowed else {})
        self.send_response(200 if allowed and self.path == "/v1/models" else 401)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def models_server():
    server = http.server.HTTPServer(("127.0.0.1", 0), KeyCheckingServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    KeyCheckingServer.seen = []
    yield server
    server.shutdown()
    server.server_close()


def summary_inventory(tmp_path: Path, host_vars: dict, **more_hosts: dict) -> Path:
    """A host the summary play reads settings of (and more_hosts: name to host vars); none is
    contacted (debug runs locally)."""
    inventory = tmp_path / "inventory"
    inventory.mkdir(parents=True)
    (inventory / "group_vars").symlink_to(REPO / "group_vars")
    named = {"ct200-summary": host_vars, **more_hosts}
    hosts = {name: {"ansible_host": "127.0.0.1", **values} for name, values in named.items()}
    tree = {"all": {"children": {"gpu_hosts": {"children": {"ct200": {"hosts": hosts}}}}}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(tree))
    return inventory


def run_summary_command(msg: str) -> subprocess.CompletedProcess:
    """The summary's command line, as a user pastes it into a shell on the host. Tests run as
    root and this machine has no sudo: the command runs without it."""
    command = msg.splitlines()[-1].strip()
    # curl alone, or the runtime's Python reading the key for it (under sudo when the run
    # does not connect as root).
    assert command.startswith(("sudo /", "curl ", "/")), msg
    command = command.removeprefix("sudo ")
    return subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=60, check=False
    )


def test_deploy_summary_checks_a_keyed_server_without_showing_the_key(
    playbook, models_server, tmp_path
):
    key = "sk-kimi-summary-7f3a 'quoted' #1"  # YAML must quote it in the secrets file
    # The secrets file as the server role writes it (to_nice_yaml, 0600).
    secrets_file = tmp_path / "sglang-secrets.yaml"
    secrets_file.write_text(yaml.safe_dump({"api_key": key}, default_flow_style=False))
    secrets_file.chmod(0o600)
    KeyCheckingServer.expected = f"Bearer {key}"
    key_vars = tmp_path / "key.yml"
    key_vars.write_text(yaml.safe_dump({"kimi_server_api_key": key}))
    port = models_server.server_address[1]
    run = playbook(
        "playbooks/summary_deploy.yml",
        summary_inventory(
            tmp_path,
            {
                "kimi_server_host": "0.0.0.0",  # noqa: S104 - a setting, nothing binds here
                "kimi_server_port": port,
                "kimi_server_secrets_file": str(secrets_file),
                # The runtime's Python reads the secrets file: here, this venv's (PyYAML).
                "kimi_runtime_pythons": {"release": sys.executable, "git": sys.executable},
            },
        ),
        vars_files=[key_vars],
    )
    assert run.rc == 0, run.stdout
    msg = run.results(DEPLOY_SUMMARY)["ct200-summary"]["msg"]
    assert f"at http://127.0.0.1:{port}." in msg, msg
    assert "(the key file is root-only)" in msg and "curl -sS -H @- " in msg, msg
    # The run connects as root: no sudo (minimal images have none).
    assert not msg.splitlines()[-1].strip().startswith("sudo "), msg
    checked = run_summary_command(msg)
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["data"][0]["id"] == "moonshotai/Kimi-K2.6"
    assert KeyCheckingServer.seen == [f"Bearer {key}"]
    assert key not in run.stdout and key not in msg
    assert not any(key in json.dumps(event) for event in run.events)


def test_deploy_summary_of_a_loopback_server_without_key(playbook, models_server, tmp_path):
    port = models_server.server_address[1]
    KeyCheckingServer.expected = ""
    ops = {"kimi_server_port": port, "ansible_user": "ops"}
    # One run, a host per case: the summary reads each host's own settings.
    run = playbook(
        "playbooks/summary_deploy.yml",
        summary_inventory(
            tmp_path,
            ops,
            # The tunnel goes the way the run connects: its port and key file too.
            **{
                "ct200-tunnel": {
                    **ops,
                    "ansible_port": 2222,
                    "ansible_ssh_private_key_file": "/home/ops/.ssh/id ed25519",
                },
                # On IPv6 loopback the forward's address goes in brackets, which ssh -L needs.
                "ct200-six": {**ops, "kimi_server_host": "::1"},
                # A keyed server reached as ops: the root-only key file is read under sudo.
                "ct200-ops": {**ops, "kimi_server_api_key": "sk-kimi-ops-1"},
            },
        ),
    )
    assert run.rc == 0, run.stdout
    said = {host: result["msg"] for host, result in run.results(DEPLOY_SUMMARY).items()}
    msg = said["ct200-summary"]
    assert f"ssh -N -L {port}:127.0.0.1:{port} ops@127.0.0.1" in msg, msg
    tunnel = f"ssh -N -L {port}:127.0.0.1:{port} -p 2222 -i '/home/ops/.ssh/id ed25519' ops@"
    assert tunnel in said["ct200-tunnel"], said
    assert f"ssh -N -L {port}:[::1]:{port} ops@127.0.0.1" in said["ct200-six"], said
    assert f"http://[::1]:{port}/v1/models" in said["ct200-six"], said
    line = said["ct200-ops"].splitlines()[-1].strip()
    assert line.startswith("sudo /") and "| curl -sS -H @- " in line, line
    assert "Check it on ct200-summary:" in msg
    checked = run_summary_command(msg)
    assert checked.returncode == 0 and "moonshotai/Kimi-K2.6" in checked.stdout, checked
    assert KeyCheckingServer.seen == [None]


def test_benchmark_summary_names_the_results_and_the_report_command(playbook, tmp_path):
    results = tmp_path / "results"
    run = playbook(
        "playbooks/summary_benchmark.yml",
        summary_inventory(tmp_path, {}),
        # What the benchmark role sets for every host of its play.
        extravars={"__benchmark_run_id": "20260102T030405Z", "benchmark_results_dir": str(results)},
    )
    assert run.rc == 0, run.stdout
    msg = run.results("Say where the results are and how to report them")["ct200-summary"]["msg"]
    assert f"{results}/20260102T030405Z/ct200-summary/" in msg, msg
    command = msg.splitlines()[-1].strip()
    assert command.endswith(f"-m analysis report {results}/20260102T030405Z"), msg
    assert command.startswith(f"cd {REPO} && "), msg
