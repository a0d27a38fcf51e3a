"""The runtime and server stages over SSH test hosts, with the simulator installed as sglang.

tests/support/fake_sglang.py packages tests/support/sglang_sim.py as an `sglang` 0.5.23 wheel;
the runtime role installs it from a wheelhouse like the real release, and the server role runs
`python -m sglang.launch_server`. Every server test runs the role on two hosts at once: `node`,
whose PID 1 is sshd (the role uses the kit's supervisor, as in a container), and `sysd`, booted
by systemd as a real GPU host is (the role installs and runs a systemd unit).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support.ansible_run import with_extra_args
from tests.support.hostprep import put_file
from tests.support.server_hosts import (
    HOST,
    SYSD,
    UNIT,
    generate,
    journal,
    readable_holding,
    restarts,
    server_log,
    server_pid,
    supervisor_state,
    unit_show,
)
from tests.support.sim_process import SERVER_ENV as SIM_ENV

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.runtime, pytest.mark.integration]

SERVER_HOSTS = (HOST, SYSD)
BOTH = ",".join(SERVER_HOSTS)
MANAGERS = {HOST: "supervisor", SYSD: "systemd"}
API_KEY = "sk-kimi-tests-4f1b9c"
ALL_INTERFACES = "0.0.0.0"  # noqa: S104 - inside the test host's own network namespace
RUNTIME = "playbooks/runtime.yml"
SERVER = "playbooks/server.yml"
START = "Start the server, restarting it only when its launch changed"
FAIL = "Fail with what the server said"
API_CHECK = "Check the endpoints users call"
API_RECORD = "/var/lib/kimi/server/api-check.json"
CHECK_RELEASE = "Check the release runtime against the sglang wheel's own requirements"
CHECK = "Look at what the host has for this launch and check it with the runtime's own parser"


@pytest.fixture(scope="module")
def cluster():
    from tests.support.testhosts import TestHostCluster

    hosts = TestHostCluster.up(["ct200", "ct200"], names=[HOST, SYSD], systemd=[SYSD])
    try:
        yield hosts
    finally:
        hosts.down()


def server_vars(**extra) -> dict:
    return {
        "kimi_serving_configs": ["ar", "dflash"],
        "kimi_server_config": "ar",
        "kimi_server_environment": SIM_ENV,
        "server_health_poll_s": 1,
        "server_restart_delay_s": 1,
        **extra,
    }


# The last server.yml run of this module, and whether it succeeded on every host it ran on.
LAST_RUN: dict = {}


def run_server(playbook, cluster, limit=BOTH, **extra):
    extravars = server_vars(**extra)
    run = playbook(SERVER, cluster.inventory, extravars=extravars, limit=limit)
    LAST_RUN.update(
        key=(limit, json.dumps(extravars, sort_keys=True)),
        ok=run.rc == 0 and not run.failed_hosts(),
    )
    return run


def serving(playbook, cluster, **extra) -> None:
    """Both servers running as run_server(**extra) launches them. Each test starts from that on
    its own; run in file order, a test often finds it left so by the one before (its last run
    had the same settings and both servers still run), and the run is not repeated."""
    key = (BOTH, json.dumps(server_vars(**extra), sort_keys=True))
    left = LAST_RUN.get("key") == key and LAST_RUN.get("ok")
    if left and all(server_pid(cluster, host) for host in SERVER_HOSTS):
        return
    run = run_server(playbook, cluster, **extra)
    assert run.rc == 0, run.stdout[-4000:]


def send(cluster, path: Path, host=HOST) -> str:
    """Copies a controller file to the same name under /root on the host; returns that path."""
    target = f"/root/{path.name}"
    put_file(cluster, host, target, path.read_bytes())
    return target


def legacy_hash_of(cluster, host, secrets: dict) -> str:
    """The unkeyed hash earlier kits recorded for the launch now on the host (its argv and
    environment hold no secret here, so launch.json has them unmasked)."""
    from ansible.module_utils.server.identity import legacy_hash

    record = json.loads(cluster.ssh(host, "cat /var/lib/kimi/server/launch.json").stdout)
    return legacy_hash(record["argv"], record["environment"], secrets)


@pytest.fixture(scope="module")
def runtime(cluster, runtime_wheelhouse, tmp_path_factory):
    from tests.support.ansible_run import run_playbook

    extravars = {
        "kimi_serving_configs": ["ar", "dflash"],
        "runtime_wheelhouse": str(runtime_wheelhouse),
    }
    first = run_playbook(
        RUNTIME,
        cluster.inventory,
        tmp_path_factory.mktemp("runtime-1"),
        extravars=extravars,
        limit=BOTH,
    )
    return first, extravars


def test_runtime_installs_the_pinned_release_and_records_it(cluster, runtime):
    """The install; that a second run changes nothing is the last run of the next test."""
    first, _ = runtime
    assert first.rc == 0, first.stdout
    record = json.loads(cluster.ssh(HOST, "cat /opt/kimi/runtime/runtime.json").stdout)
    release = record["release"]
    assert release["version"] == "0.5.23"
    assert release["import_version"] == "0.5.23"
    assert release["ok"] and release["pip_check"]["ok"]
    pins = {r["name"]: r["installed"] for r in release["requirements"]}
    assert pins == {
        "pyyaml": "6.0.4", "packaging": "26.4", "jinja2": "3.1.6", "markupsafe": "3.0.4"
    }  # fmt: skip
    assert record["git"] is None


def test_runtime_restores_a_changed_pin_and_names_what_pip_cannot_fix(
    playbook, cluster, runtime, tmp_path
):
    from tests.support.fake_sglang import wheel

    _, extravars = runtime
    # An older packaging replaces sglang's pin, as a stray `pip install` would.
    old = send(cluster, wheel(tmp_path, "packaging", "25.0", {"packaging/__init__.py": b""}, []))
    plugin = send(
        cluster, wheel(tmp_path, "kimi-plugin", "1.0", {"kimi_plugin.py": b""}, ["packaging==25.0"])
    )
    # sglang's own pin broken where pip install does not look (check mode: no install).
    cluster.ssh(HOST, f"/opt/kimi/venv/bin/python -m pip install -q --no-deps {old}")
    checked = playbook(RUNTIME, cluster.inventory, extravars=extravars, limit=HOST, check=True)
    message = checked.results(CHECK_RELEASE)[HOST]["msg"]
    assert "packaging: 25.0, but sglang 0.5.23 requires packaging==26.4" in message

    # Then a real run puts the pin back, as after a stray `pip install`.
    restored = playbook(RUNTIME, cluster.inventory, extravars=extravars, limit=HOST)
    assert restored.rc == 0, restored.stdout
    assert restored.results("Install the pinned SGLang release")[HOST]["changed"]
    record = json.loads(cluster.ssh(HOST, "cat /opt/kimi/runtime/runtime.json").stdout)
    assert record["release"]["packages"]["packaging"] == "26.4"

    # A package added by hand that needs other versions: pip check is not clean.
    cluster.ssh(HOST, f"/opt/kimi/venv/bin/python -m pip install -q --no-deps {plugin}")
    refused = playbook(RUNTIME, cluster.inventory, extravars=extravars, limit=HOST)
    assert refused.rc != 0, refused.stdout
    message = refused.results(CHECK_RELEASE)[HOST]["msg"]
    assert "pip check: kimi-plugin 1.0 has requirement packaging==25.0" in message
    assert "uninstall what was added to the environment by hand" in message
    cluster.ssh(HOST, "/opt/kimi/venv/bin/python -m pip uninstall -q -y kimi-plugin")

    # With it removed the venv is the restored one again: a run on either host (the other
    # untouched since the install) changes nothing.
    again = playbook(RUNTIME, cluster.inventory, extravars=extravars, limit=BOTH)
    again.assert_unchanged()


def test_server_starts_healthy_and_a_second_run_changes_nothing(playbook, cluster, runtime):
    first = run_server(playbook, cluster)
    assert first.rc == 0, first.stdout
    shown = first.results("Show the launch")
    for host in SERVER_HOSTS:
        assert shown[host]["msg"]["manager"] == MANAGERS[host]
        # The launch was checked by the release's own parser first.
        assert first.results(CHECK)[host]["mode"] == "prepare_server_args"
        assert first.results(START)[host]["action"] == "started"
        assert first.server_health()[host]["state"] == "healthy"
        assert generate(cluster, host) == "200"
    pids = {host: server_pid(cluster, host) for host in SERVER_HOSTS}
    # systemd runs it as a unit: enabled, active, in its own cgroup, its output in the journal.
    unit = unit_show(
        cluster,
        "ActiveState",
        "UnitFileState",
        "ControlGroup",
        "FragmentPath",
        "Restart",
        "LimitNOFILE",
        "KillMode",
    )
    assert unit == {
        "ActiveState": "active",
        "UnitFileState": "enabled",
        "ControlGroup": f"/system.slice/{UNIT}.service",
        "FragmentPath": f"/etc/systemd/system/{UNIT}.service",
        "Restart": "on-failure",
        "LimitNOFILE": "1048576",
        "KillMode": "control-group",
    }
    # The launch's environment, and its keyed identity (root-only; without it the launch
    # counts as unknown and the next run restarts it).
    files = cluster.ssh(SYSD, f"systemctl show {UNIT} -p EnvironmentFiles").stdout.split("\n")
    assert [line for line in files if line] == [
        f"EnvironmentFiles=/etc/kimi/{UNIT}.env (ignore_errors=no)",
        f"EnvironmentFiles=/etc/kimi/{UNIT}.identity (ignore_errors=yes)",
    ]
    cgroup = cluster.ssh(SYSD, f"cat /proc/{pids[SYSD]}/cgroup").stdout
    assert f"0::/system.slice/{UNIT}.service" in cgroup
    assert "simulated sglang 0.5.23 serving on 127.0.0.1:30000" in server_log(cluster, SYSD)
    # SGLang's first line carries the resolved arguments: the log file, not the journal.
    assert "server_args=ServerArgs(" in server_log(cluster, SYSD)
    assert "server_args=ServerArgs(" not in journal(cluster)
    verify = cluster.ssh(
        SYSD,
        f"SYSTEMD_LOG_LEVEL=warning systemd-analyze verify /etc/systemd/system/{UNIT}.service",
        check=False,
    )
    assert verify.returncode == 0 and not verify.stderr.strip(), verify.stdout + verify.stderr
    # Healthy and usable: the API users call passes every check, recorded beside launch.json.
    for host in SERVER_HOSTS:
        assert first.results(API_CHECK)[host]["passed"] is True
        record = json.loads(cluster.ssh(host, f"cat {API_RECORD}").stdout)
        assert record["config"] == "ar" and record["passed"] is True
        assert {c["name"]: c["passed"] for c in record["checks"]} == dict.fromkeys(
            ("models", "chat", "chat_stream", "tool_call", "reasoning"), True
        )
        assert cluster.ssh(host, f"stat -c %a {API_RECORD}").stdout.strip() == "644"
    second = run_server(playbook, cluster)
    second.assert_unchanged()
    assert {host: server_pid(cluster, host) for host in SERVER_HOSTS} == pids
    for host in SERVER_HOSTS:
        modes = cluster.ssh(host, f"stat -c '%a %n' /etc/kimi/{UNIT}.env").stdout
        assert modes.startswith("600 ")


def test_an_unknown_extra_flag_fails_the_deploy_before_the_server_is_touched(
    playbook, cluster, runtime
):
    """The deploy-time launch check: a flag the user added in kimi_server_settings.extra_args
    that the runtime does not know fails the run naming it, and the running server is left as
    it was (tests/integration/test_launch_check.py checks DDTree on the git runtime)."""
    serving(playbook, cluster)
    pid = server_pid(cluster, HOST)
    launch = cluster.ssh(HOST, "cat /var/lib/kimi/server/launch.json").stdout
    refused = run_server(
        playbook, cluster, limit=HOST, server_settings=with_extra_args("--enable-metricz")
    )
    assert refused.rc != 0
    result = refused.results(CHECK)[HOST]
    assert result["failed"] and result["flags"] == ["--enable-metricz"]
    assert "unrecognized arguments: --enable-metricz" in result["msg"]
    assert "kimi_server_settings.extra_args" in result["msg"]
    assert "The running server was left as it is" in result["msg"]
    assert START not in {e["event_data"].get("task") for e in refused.events}
    # The same server process, launch record and answers as before.
    assert server_pid(cluster, HOST) == pid
    assert cluster.ssh(HOST, "cat /var/lib/kimi/server/launch.json").stdout == launch
    assert generate(cluster, HOST) == "200"
    # A flag the release knows passes, and a second run of the good launch changes nothing.
    again = run_server(playbook, cluster)
    again.assert_unchanged()


def test_argv_change_restarts_exactly_once(playbook, cluster, runtime):
    serving(playbook, cluster)
    before = {host: server_pid(cluster, host) for host in SERVER_HOSTS}
    changed = run_server(playbook, cluster, kimi_server_config="dflash")
    assert changed.rc == 0, changed.stdout
    for host in SERVER_HOSTS:
        assert changed.results(START)[host]["action"] == "restarted"
        after = server_pid(cluster, host)
        assert after != before[host]
        cmdline = cluster.ssh(host, f"tr '\\0' ' ' < /proc/{after}/cmdline").stdout
        assert "--speculative-algorithm DFLASH" in cmdline
    pids = {host: server_pid(cluster, host) for host in SERVER_HOSTS}
    again = run_server(playbook, cluster, kimi_server_config="dflash")
    again.assert_unchanged()
    assert {host: server_pid(cluster, host) for host in SERVER_HOSTS} == pids
    # A change of launch is a stop and a start, not a crash: no restart counted.
    assert {host: restarts(cluster, host) for host in SERVER_HOSTS} == dict.fromkeys(
        SERVER_HOSTS, 0
    )


def test_a_killed_server_is_restarted_by_its_manager(playbook, cluster, runtime):
    serving(playbook, cluster, kimi_server_config="dflash")
    pids = {host: server_pid(cluster, host) for host in SERVER_HOSTS}
    counts = {host: restarts(cluster, host) for host in SERVER_HOSTS}
    # The managers restart the server as an earlier kit had launched it: with the unkeyed hash
    # in its environment (the unit's Environment= line, the supervisor's copy of the value).
    legacy = {host: legacy_hash_of(cluster, host, {}) for host in SERVER_HOSTS}
    cluster.ssh(
        SYSD,
        f"sed -i 's|^EnvironmentFile=-/etc/kimi/{UNIT}.identity$|"
        f"Environment=KIMI_SERVER_CONFIG_HASH={legacy[SYSD]}|' /etc/systemd/system/{UNIT}.service"
        " && systemctl daemon-reload",
    )
    identity = f'KIMI_SERVER_CONFIG_HASH="{legacy[HOST]}"\n'.encode()
    put_file(cluster, HOST, f"/etc/kimi/{UNIT}.identity", identity, mode="0600")
    for host in SERVER_HOSTS:
        cluster.ssh(host, f"kill -9 {pids[host]}")
    deadline = time.monotonic() + 30
    for host in SERVER_HOSTS:
        while time.monotonic() < deadline:
            pid = server_pid(cluster, host)
            if pid not in (0, pids[host]) and restarts(cluster, host) > counts[host]:
                break
            time.sleep(0.3)
        assert restarts(cluster, host) == counts[host] + 1, host
    state = supervisor_state(cluster)
    assert state["status"] == "running" and state["last_exit"] == -9, state
    log = cluster.ssh(HOST, "cat /var/log/kimi/sglang.log").stdout
    assert f"server exited with status -9; restart {counts[HOST] + 1}" in log
    said = journal(cluster)
    assert "Main process exited, code=killed, status=9/KILL" in said
    assert f"Scheduled restart job, restart counter is at {counts[SYSD] + 1}" in said
    deadline = time.monotonic() + 30
    for host in SERVER_HOSTS:
        while generate(cluster, host) != "200" and time.monotonic() < deadline:
            time.sleep(0.5)
    # The rest of an earlier kit's records: the hash in launch.json and in a state file others
    # could read, and no key or identity file.
    for host in SERVER_HOSTS:
        environ = cluster.ssh(host, f"tr '\\0' '\\n' < /proc/{server_pid(cluster, host)}/environ")
        assert f"KIMI_SERVER_CONFIG_HASH={legacy[host]}" in environ.stdout.split("\n"), host
        record = json.loads(cluster.ssh(host, "cat /var/lib/kimi/server/launch.json").stdout)
        launch = json.dumps({**record, "config_hash": legacy[host]}).encode()
        put_file(cluster, host, "/var/lib/kimi/server/launch.json", launch)
        cluster.ssh(host, f"rm /etc/kimi/server-identity.key /etc/kimi/{UNIT}.identity")
    cluster.ssh(HOST, "chmod 644 /var/lib/kimi/server/kimi-sglang.state.json")
    assert all(readable_holding(cluster, host, legacy[host]) for host in SERVER_HOSTS)
    restarted = {host: server_pid(cluster, host) for host in SERVER_HOSTS}
    # Still the wanted launch: the next run keeps the server and only rewrites the records to
    # the keyed identity (tests/unit/test_server_identity.py shows the run after that is idle).
    again = run_server(playbook, cluster, kimi_server_config="dflash")
    assert again.rc == 0, again.stdout
    for host in SERVER_HOSTS:
        started = again.results(START)[host]
        assert (started["action"], started["previous_identity"]) == ("recorded", "legacy")
        assert server_pid(cluster, host) == restarted[host], host
        assert readable_holding(cluster, host, legacy[host]) == [], host
        record = json.loads(cluster.ssh(host, "cat /var/lib/kimi/server/launch.json").stdout)
        assert "config_hash" not in record
    shown = cluster.ssh(SYSD, f"systemctl show {UNIT} -p Environment").stdout
    assert "KIMI_SERVER_CONFIG_HASH" not in shown


def test_a_tool_parser_that_does_not_engage_fails_the_api_check(playbook, cluster, runtime):
    """The launch asks for kimi_k2's tool-call parser; the server runs as if without it, so a
    forced tool_choice comes back as JSON text in the content. The role fails, naming the
    check, what came back and the flag to check."""
    environment = {**SIM_ENV, "SGLANG_SIM_IGNORE_PARSERS": "tool_call"}
    run = run_server(playbook, cluster, limit=HOST, kimi_server_environment=environment)
    assert run.rc != 0
    message = run.results("Fail when an API check failed")[HOST]["msg"]
    assert 'tool_call: found no tool_calls; content \'[{"name": "get_weather"' in message
    assert "--tool-call-parser kimi_k2" in message
    record = json.loads(cluster.ssh(HOST, f"cat {API_RECORD}").stdout)
    assert [c["name"] for c in record["checks"] if c["passed"] is False] == ["tool_call"]


def test_health_timeout_fails_with_the_log_tail(playbook, cluster, runtime):
    slow = run_server(
        playbook,
        cluster,
        kimi_server_environment={**SIM_ENV, "SGLANG_SIM_LOAD_SECONDS": "600"},
        server_health_timeout_s=4,
    )
    assert slow.rc != 0
    for host in SERVER_HOSTS:
        message = slow.results(FAIL)[host]["msg"]
        assert "no answer from /health_generate within 4 s" in message
        assert "full log: /var/log/kimi/sglang.log" in message
        tail = slow.results("Show the end of the server's log")[host]["msg"]
        # Still loading: SGLang opens its port only once the model is loaded.
        assert any("simulated sglang 0.5.23 loading for 600 s" in line for line in tail)


def test_crash_on_start_fails_fast_with_the_log_tail(playbook, cluster, runtime):
    started = time.monotonic()
    crashing = run_server(
        playbook,
        cluster,
        kimi_server_environment={**SIM_ENV, "SGLANG_SIM_CRASH_ON_START": "1"},
        server_health_timeout_s=300,
    )
    assert crashing.rc != 0
    assert time.monotonic() - started < 120
    for host in SERVER_HOSTS:
        message = crashing.results(FAIL)[host]["msg"]
        assert "crashed while starting" in message or "not running" in message, message
        tail = crashing.results("Show the end of the server's log")[host]["msg"]
        assert any("simulated crash on start" in line for line in tail), (host, tail)


def test_api_key_beyond_loopback_stays_off_the_command_line(playbook, cluster, runtime, tmp_path):
    run = run_server(
        playbook, cluster, kimi_server_host=ALL_INTERFACES, kimi_server_api_key=API_KEY
    )
    assert run.rc == 0, run.stdout
    for host in SERVER_HOSTS:
        pid = server_pid(cluster, host)
        cmdline = cluster.ssh(host, f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
        assert API_KEY not in cmdline
        assert "--config /etc/kimi/sglang-secrets.yaml" in cmdline
        mode = cluster.ssh(host, "stat -c %a /etc/kimi/sglang-secrets.yaml").stdout.strip()
        assert mode == "600"
        assert generate(cluster, host) == "401"
        assert generate(cluster, host, key=API_KEY) == "200"
    written = cluster.ssh(
        HOST, "cat /var/lib/kimi/server/launch.json /etc/kimi/kimi-sglang-supervise.json"
    ).stdout
    written += cluster.ssh(
        SYSD,
        f"cat /var/lib/kimi/server/launch.json /etc/systemd/system/{UNIT}.service; "
        f"systemctl show {UNIT} -p Environment,ExecStart",
    ).stdout
    assert API_KEY not in written
    # What the run wrote (the test's own extravars under env/ hold the key it passed in).
    for path in (Path(run.private_dir) / "artifacts").rglob("*"):
        if path.is_file():
            assert API_KEY not in path.read_text(errors="replace"), path
    # Nor does the unkeyed hash earlier kits recorded, nor the key it is keyed with now.
    legacy = {host: legacy_hash_of(cluster, host, {"api_key": API_KEY}) for host in SERVER_HOSTS}
    for host in SERVER_HOSTS:
        key = cluster.ssh(host, "cat /etc/kimi/server-identity.key").stdout.strip()
        assert len(key) == 64, "the host's identity key is missing"
        # The keyed identity in the server's environment: only root reads /proc/<pid>/environ.
        pid = server_pid(cluster, host)
        owner = cluster.ssh(host, f"stat -c '%U %a' /proc/{pid}/environ").stdout.split()
        assert owner == ["root", "400"], owner
        assert readable_holding(cluster, host, API_KEY, legacy[host], key) == [], host
        modes = cluster.ssh(
            host, f"stat -c '%a %n' /etc/kimi/server-identity.key /etc/kimi/{UNIT}.identity"
        ).stdout.split()
        assert modes[::2] == ["600", "600"], modes

    # Back to loopback: the key file goes away.
    assert run_server(playbook, cluster).rc == 0
    for host in SERVER_HOSTS:
        gone = cluster.ssh(host, "test -e /etc/kimi/sglang-secrets.yaml", check=False)
        assert gone.returncode == 1


# Right after the API-key test, whose last run left both servers as serving() starts them.
def test_teardown_stops_the_server(playbook, cluster, runtime):
    serving(playbook, cluster)
    pids = {host: server_pid(cluster, host) for host in SERVER_HOSTS}
    down = playbook("teardown.yml", cluster.inventory, extravars=server_vars(), limit=BOTH)
    LAST_RUN.clear()
    assert down.rc == 0, down.stdout
    for host in SERVER_HOSTS:
        assert down.results("Stop the server")[host]["action"] == "stopped"
        assert cluster.ssh(host, f"test -d /proc/{pids[host]}", check=False).returncode == 1
    assert supervisor_state(cluster)["status"] == "stopped"
    assert unit_show(cluster, "ActiveState", "UnitFileState") == {
        "ActiveState": "inactive",
        "UnitFileState": "disabled",
    }
    again = playbook("teardown.yml", cluster.inventory, extravars=server_vars(), limit=BOTH)
    assert again.rc == 0, again.stdout
    assert {again.results("Stop the server")[h]["changed"] for h in SERVER_HOSTS} == {False}


RANK_WAIT = "Wait until this node joined its head (a multi-node server's other ranks)"


def test_a_two_node_server_waits_for_its_other_rank_before_its_head(
    playbook, cluster, runtime, tmp_path
):
    """node and sysd as one server (a kimi_cluster_* group, node first: the head). sysd's rank
    is waited for before the head, whose API opens only once sysd joined its torch.distributed
    (the simulator plays SGLang's rendezvous and rank 1's dummy health server); a rerun
    changes nothing, and teardown stops both."""
    from tests.support.fleet import add_group, inventory_copy

    inventory = add_group(inventory_copy(cluster, tmp_path), "kimi_cluster_pair", [HOST, SYSD])
    pair = playbook(SERVER, inventory, extravars=server_vars())
    LAST_RUN.clear()
    assert pair.rc == 0, pair.stdout[-6000:]
    done = [
        (event["event_data"].get("task"), event["event_data"].get("host"))
        for event in pair.events
        if event.get("event") == "runner_on_ok"
    ]
    assert done.index((RANK_WAIT, SYSD)) < done.index(("Wait for the server to load", HOST))
    assert pair.results(RANK_WAIT)[SYSD]["state"] == "healthy"
    head = f"{cluster.host(HOST).address}:50000"
    for host, rank in ((HOST, 0), (SYSD, 1)):
        cmdline = cluster.ssh(host, f"tr '\\0' ' ' < /proc/{server_pid(cluster, host)}/cmdline")
        assert f"--nnodes 2 --node-rank {rank} --dist-init-addr {head}" in cmdline.stdout
    assert "every node joined" in server_log(cluster, HOST)
    # The head serves the API; rank 1 only its health check.
    assert generate(cluster, HOST) == "200" and generate(cluster, SYSD) == "404"
    playbook(SERVER, inventory, extravars=server_vars()).assert_unchanged()
    down = playbook("teardown.yml", inventory, extravars=server_vars())
    assert down.rc == 0, down.stdout[-4000:]
    # A node that loses the other exits by itself (NCCL's abort): its stop may find nothing
    # left to stop. Both end stopped, their managers too.
    assert {down.results("Stop the server")[h]["action"] for h in (HOST, SYSD)} <= {
        "stopped",
        "none",
    }
    assert server_pid(cluster, HOST) == 0 and server_pid(cluster, SYSD) == 0
    assert supervisor_state(cluster)["status"] == "stopped"
    assert unit_show(cluster, "ActiveState")["ActiveState"] == "inactive"


def test_a_rolling_restart_of_a_fleet_keeps_its_router_answering(
    playbook, cluster, runtime, router_wheelhouse, tmp_path
):
    """Both servers as one fleet behind SGLang's router on node; a changed launch restarted one
    host at a time (kimi_deploy_serial=1) under steady load through the router: each replica
    leaves the router before its restart and comes back after its checks, and no request
    fails. A rerun that restarts nothing leaves the router alone."""
    from tests.support.fleet import add_fleet, inventory_copy, steady_load

    fleet_vars = {"kimi_server_host": ALL_INTERFACES, "kimi_server_api_key": API_KEY}
    serving(playbook, cluster, **fleet_vars)
    inventory = add_fleet(inventory_copy(cluster, tmp_path), "kimi_router_pair", [HOST, SYSD], HOST)
    routed = playbook(
        "playbooks/router.yml",
        inventory,
        extravars=server_vars(
            **fleet_vars,
            kimi_router_policy="round_robin",
            router_wheelhouse=str(router_wheelhouse),
            router_health_check_interval_s=1,
            kimi_controller_cache_dir=str(tmp_path / "cache"),
        ),
    )
    assert routed.rc == 0, routed.stdout[-4000:]
    changed = {**SIM_ENV, "SGLANG_SIM_STEP_MS": "6"}
    rolling = server_vars(**fleet_vars, kimi_server_environment=changed, kimi_deploy_serial=1)
    router = f"http://{cluster.host(HOST).address}:30080/generate"
    with steady_load(router, API_KEY) as answers:
        rolled = playbook(SERVER, inventory, extravars=rolling)
    LAST_RUN.clear()
    assert rolled.rc == 0, rolled.stdout[-6000:]
    out = rolled.results("Take the replica out of its router and let its requests finish")
    back = rolled.results("Put the replica back in its router")
    for host in SERVER_HOSTS:
        assert rolled.results(START)[host]["action"] == "restarted"
        assert out[host]["drained"] and back[host]["changed"], (out, back)
    failed = [answer for answer in answers if answer != 200]
    assert len(answers) >= 20 and not failed, (len(answers), failed[:5])
    print(f"\nrolling restart of 2 replicas: {len(answers)} requests, {len(failed)} failed")
    playbook(SERVER, inventory, extravars=rolling).assert_unchanged()
