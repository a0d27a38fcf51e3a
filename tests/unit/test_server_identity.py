"""The server's launch identity: keyed on the host, never readable by others, and a server an
earlier kit started (unkeyed hash) kept running when its launch did not change.

The role's files are rendered here with Ansible's own templating from roles/server/tasks/main.yml;
server_service runs in-process against real processes (a stand-in for an earlier kit's
supervisor, then the kit's own kimi_supervise.py), with every path in a temporary folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.server import identity as server_identity

from tests.support.modules import add_filter_plugins, run_module

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "server"
API_KEY = "sk-kimi-weak-1234"
PYTHON = "/opt/kimi/venv/bin/python"
SECRETS_FILE = "/etc/kimi/sglang-secrets.yaml"
# The expression earlier kits' server role set __server_hash with, verbatim.
LEGACY_EXPRESSION = (
    "{{ [__server_launch_raw.argv, __server_launch_raw.environment,"
    " ({'api_key': server_api_key} if __server_launch_raw.secrets else {})]"
    " | to_json(sort_keys=true) | hash('sha256') }}"
)


def templar(variables: dict):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    add_filter_plugins()
    return Templar(loader=DataLoader(), variables=variables)


def trusted(value):
    """YAML of the role's own files, trusted as templates, as ansible-playbook trusts them."""
    from ansible.template import trust_as_template

    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {key: trusted(item) for key, item in value.items()}
    if isinstance(value, list):
        return [trusted(item) for item in value]
    return value


def role_tasks(name: str) -> list[dict]:
    return trusted(yaml.safe_load((ROLE / "tasks" / name).read_text()))


def render(expression: str, variables: dict):
    from ansible.template import trust_as_template

    return templar(variables).template(trust_as_template(expression))


def launch(api_key=API_KEY, environment=None, argv_extra=()) -> dict:
    argv = [PYTHON, "-m", "sglang.launch_server", "--host", "0.0.0.0", "--port", "30000"]  # noqa: S104
    argv += [*argv_extra, "--config", SECRETS_FILE]
    return {
        "name": "ar",
        "base": "ar",
        "budget": None,
        "argv": argv,
        "environment": environment if environment is not None else {"NCCL_P2P_DISABLE": "1"},
        "runtime": "sglang==0.5.23",
        "secrets": {"api_key": api_key},
    }


def legacy_by_ansible(raw: dict, api_key=API_KEY) -> str:
    return render(LEGACY_EXPRESSION, {"__server_launch_raw": raw, "server_api_key": api_key})


@pytest.mark.parametrize(
    "raw",
    [
        launch(),
        # Non-ASCII, quotes, backslashes, control characters and key order all reach the hash.
        launch(
            api_key='k\u00e9y "q" \\ \U0001f600',
            environment={"Z_LAST": "\u2603", "A_FIRST": "tab\there", "M": "</x>\n"},
            argv_extra=("--served-model-name", "Kimi \u00fc"),
        ),
        {**launch(), "secrets": {}, "environment": {}},
    ],
)
def test_legacy_hash_is_what_ansible_computed(raw):
    secrets = raw["secrets"]
    expected = legacy_by_ansible(raw, api_key=secrets.get("api_key", API_KEY))
    assert server_identity.legacy_hash(raw["argv"], raw["environment"], secrets) == expected


# --- the role's files ---------------------------------------------------------------------


def role_files(api_key: str, manager: str) -> dict[str, tuple[int, str]]:
    """Every file the role's tasks write from its variables: name -> (mode, content), rendered
    as Ansible would from tasks/main.yml with the role's vars, the set_fact tasks evaluated in
    order."""
    raw = launch(api_key)
    masked = {
        **raw,
        "secrets": dict.fromkeys(raw["secrets"], "********"),
    }
    variables = {
        "server_config": "ar",
        "server_model_title": "Kimi K2.6",
        "server_api_key": api_key,
        "server_settings": {"secrets_file": SECRETS_FILE, "node_rank": 0},
        "server_unit_name": "kimi-sglang",
        "server_unit_dir": "/etc/systemd/system",
        "server_config_dir": "/etc/kimi",
        "server_state_dir": "/var/lib/kimi/server",
        "server_log_file": "/var/log/kimi/sglang.log",
        "server_log_rotate_size": "1G",
        "server_log_rotate_keep": 4,
        "server_bin_dir": "/opt/kimi/bin",
        "server_restart_delay_s": 10,
        "server_restart_max": 3,
        "server_restart_window_s": 3600,
        "server_stop_timeout_s": 120,
        "server_file_limit": 1048576,
        "server_manager": manager,
        "server_api_check": True,
        "server_wait_for_health": True,
        # A host of no fleet: its router is not asked around the restart.
        "server_router_rotation": True,
        "group_names": ["gpu_hosts", "ct200"],
        # What server_inspect answers for the launch (module_utils/server/inspect.py).
        "__server_host": {
            "manager": manager,
            "systemd": manager == "systemd",
            "python_exists": True,
            "runtime_dir": "/opt/kimi/runtimes/release-0123456789ab",
        },
        "__server_rendered": {"configs": [masked], "configs_unmasked": [raw]},
        # The role's vars (the manager, the names of its files), templated where used.
        **trusted(yaml.safe_load((ROLE / "vars" / "main.yml").read_text())),
    }
    files = {}
    # main.yml, then what it includes to start the server on its runtime folder.
    variables["__server_runtime_dir_wanted"] = "/opt/kimi/runtimes/release-0123456789ab"
    tasks = []
    for task in role_tasks("main.yml"):
        # The include of runtime_dir.yml in its place (the files after it name the runtime
        # folder); start.yml's, inside the block that starts the server, after main.yml's.
        if task.get("ansible.builtin.include_tasks") == "runtime_dir.yml":
            tasks += role_tasks("runtime_dir.yml")
        else:
            tasks.append(task)
    tasks += role_tasks("start.yml")
    for task in tasks:
        scope = {**variables, **task.get("vars", {})}
        if "ansible.builtin.set_fact" in task:
            variables.update(templar(scope).template(task["ansible.builtin.set_fact"]))
            continue
        if "server_files" in task:
            files.update(server_files_written(task["server_files"], scope))
            continue
        for action in ("ansible.builtin.copy", "ansible.builtin.template"):
            args = task.get(action)
            if not args or ("content" not in args and action.endswith("copy")):
                continue
            if action.endswith("template"):
                source = (ROLE / "templates" / args["src"]).read_text()
                content = templar(scope).template(trusted(source))
            else:
                content = templar(scope).template(args["content"])
            dest = templar(scope).template(args["dest"])
            files[dest] = (int(str(args["mode"]), 8), str(content))
    return files


def server_files_written(args: dict, scope: dict) -> dict[str, tuple[int, str]]:
    """What a server_files task writes from the role's variables, each file's content as its
    action plugin renders it; a file copied as it is from the role's files/ (the supervisor's
    code) holds none of them."""
    entries = templar(scope).template(args["files"])
    secrets = templar(scope).template(args.get("secret_contents", {}))
    written = {}
    for entry in entries:
        if entry.get("state", "file") != "file" or entry.get("src"):
            continue
        if entry.get("template"):
            source = (ROLE / "templates" / entry["template"]).read_text()
            content = templar(scope).template(trusted(source))
        elif entry.get("secret"):
            content = secrets[entry["path"]]
        else:
            content = entry["content"]
        written[entry["path"]] = (int(str(entry["mode"]), 8), str(content))
    return written


@pytest.mark.parametrize("manager", ["systemd", "supervisor"])
def test_files_others_can_read_carry_no_key_and_no_hash_of_it(manager):
    files = role_files(API_KEY, manager)
    # The role writes these others can read (and the test would be empty without them).
    readable = {name: text for name, (mode, text) in files.items() if mode & 0o004}
    assert {"/var/lib/kimi/server/launch.json"} <= set(readable)
    if manager == "systemd":
        assert "/etc/systemd/system/kimi-sglang.service" in readable
    legacy = legacy_by_ansible(launch(API_KEY))
    for name, text in readable.items():
        assert API_KEY not in text, name
        assert legacy not in text, f"{name} holds the unkeyed hash of the launch"
        assert "config_hash" not in text and "CONFIG_HASH" not in text, name
    assert "config_hash" not in json.loads(readable["/var/lib/kimi/server/launch.json"])


# --- the key --------------------------------------------------------------------------------


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_key_is_made_on_the_host_root_only_and_random_per_host(tmp_path):
    first, second = tmp_path / "host-a.key", tmp_path / "host-b.key"
    assert server_identity.load_key(str(first), create=False) is None
    assert not first.exists()
    key_a = server_identity.load_key(str(first), create=True)
    key_b = server_identity.load_key(str(second), create=True)
    assert len(key_a) == 32 and key_a != key_b
    assert mode_of(first) == 0o600 and mode_of(second) == 0o600
    # Made once: later runs read the same key.
    assert server_identity.load_key(str(first), create=True) == key_a
    argv, environment, secrets = launch()["argv"], {}, {"api_key": API_KEY}
    identity_a = server_identity.keyed_identity(key_a, argv, environment, secrets)
    identity_b = server_identity.keyed_identity(key_b, argv, environment, secrets)
    assert identity_a != identity_b and identity_a.startswith("hmac-sha256:")
    # A key others could have read is refused, with the fix.
    first.chmod(0o644)
    with pytest.raises(server_identity.IdentityError, match=r"readable by others.*remove it"):
        server_identity.load_key(str(first), create=True)
    second.write_text("not a key\n")
    with pytest.raises(server_identity.IdentityError, match="does not hold a key"):
        server_identity.load_key(str(second), create=True)


# --- migration through server_service -------------------------------------------------------

# What an earlier kit's supervisor left: the server's environment with the unkeyed hash, a
# state file others can read holding it, the pid file; SIGTERM stops the server's group.
EARLIER_SUPERVISOR = r"""
import json, os, signal, subprocess, sys, time
spec = json.load(open(sys.argv[1]))
child = subprocess.Popen(
    spec["argv"], env={**os.environ, "KIMI_SERVER_CONFIG_HASH": spec["config_hash"]},
    start_new_session=True,
)
with open(spec["pid_file"], "w") as handle:
    handle.write(f"{os.getpid()}\n")
state = {"supervisor_pid": os.getpid(), "child_pid": child.pid, "status": "running",
         "restarts": 0, "last_exit": None, "config_hash": spec["config_hash"],
         "updated_at": time.time()}
with open(spec["state_file"] + ".tmp", "w") as handle:
    handle.write(json.dumps(state))
os.chmod(spec["state_file"] + ".tmp", 0o644)
os.replace(spec["state_file"] + ".tmp", spec["state_file"])
def stop(*_):
    os.killpg(child.pid, signal.SIGTERM)
    child.wait()
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while True:
    time.sleep(1)
"""
SERVER = "import time; time.sleep(300)"


def process_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode().partition("=")[::2] for item in raw.split(b"\0") if item)


def wait_for(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


@pytest.fixture
def host(tmp_path):
    """A supervisor-managed server's files under tmp_path, and the processes to clean up."""
    etc, state = tmp_path / "etc", tmp_path / "state"
    etc.mkdir(mode=0o755)
    state.mkdir(mode=0o755)
    env_file = etc / "kimi-sglang.env"
    env_file.write_text('NCCL_P2P_DISABLE="1"\n')
    env_file.chmod(0o600)
    paths = {
        "etc": etc,
        "state_dir": state,
        "spec_file": etc / "kimi-sglang-supervise.json",
        "identity_file": etc / "kimi-sglang.identity",
        "key_file": etc / "server-identity.key",
        "pid_file": state / "kimi-sglang.pid",
        "state_file": state / "kimi-sglang.state.json",
        "env_file": env_file,
        "log_file": tmp_path / "sglang.log",
    }
    groups: list[int] = []
    paths["groups"] = groups
    yield paths
    with contextlib.suppress(OSError, ValueError):
        state = json.loads(paths["state_file"].read_text())
        groups += [state.get("supervisor_pid"), state.get("child_pid")]
    # Each of these leads its own session (start_new_session), hence its own group.
    for pid in filter(None, groups):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def write_spec(host, argv, **extra) -> None:
    spec = {
        "argv": argv,
        "env_file": str(host["env_file"]),
        "identity_file": str(host["identity_file"]),
        "log_file": str(host["log_file"]),
        "pid_file": str(host["pid_file"]),
        "state_file": str(host["state_file"]),
        "working_dir": str(host["state_dir"]),
        "restart_delay_s": 1,
        "restart_max": 3,
        "restart_window_s": 3600,
        "stop_timeout_s": 5,
        "file_limit": 0,
        **extra,
    }
    host["spec_file"].write_text(json.dumps(spec))
    host["spec_file"].chmod(0o600)


def service(host, raw: dict, state="started") -> dict:
    wanted = {"argv": raw["argv"], "environment": raw["environment"], "secrets": raw["secrets"]}
    return run_module(
        "server_service",
        {
            "manager": "supervisor",
            "state": state,
            "launch": json.dumps(wanted),
            "identity_file": str(host["identity_file"]),
            "key_file": str(host["key_file"]),
            "spec_file": str(host["spec_file"]),
            "supervisor_script": str(ROLE / "files" / "kimi_supervise.py"),
            "pid_file": str(host["pid_file"]),
            "state_file": str(host["state_file"]),
            "stop_timeout": 5,
            "start_timeout": 20,
        },
    )


def readable_by_others(root: Path) -> dict[Path, str]:
    return {
        path: path.read_text(errors="replace")
        for path in root.rglob("*")
        if path.is_file() and mode_of(path) & 0o044
    }


def test_an_earlier_kits_server_is_kept_and_a_new_api_key_restarts_it(host):
    argv = [sys.executable, "-c", SERVER]
    raw = {**launch(), "argv": argv}
    legacy = legacy_by_ansible(raw)
    # The records an earlier kit wrote: the spec with the unkeyed hash, and its supervisor.
    write_spec(host, argv, config_hash=legacy)
    earlier = subprocess.Popen(
        [sys.executable, "-c", EARLIER_SUPERVISOR, str(host["spec_file"])],
        start_new_session=True,
    )
    host["groups"].append(earlier.pid)
    state = wait_for(
        lambda: host["state_file"].exists() and json.loads(host["state_file"].read_text())
    )
    server = state["child_pid"]
    host["groups"].append(server)
    wait_for(lambda: process_env(server).get("KIMI_SERVER_CONFIG_HASH") == legacy)
    assert legacy in readable_by_others(host["state_dir"])[host["state_file"]]

    # The role rewrites the spec without the hash (its own task), then server_service runs.
    write_spec(host, argv)
    migrated = service(host, raw)
    assert not migrated.get("failed"), migrated
    assert migrated["changed"] and migrated["action"] == "recorded", migrated
    assert migrated["previous_identity"] == "legacy" and migrated["pid"] == server
    assert earlier.poll() is None and process_env(server)  # nothing was restarted
    assert legacy not in json.dumps(migrated) and API_KEY not in json.dumps(migrated)
    key = host["key_file"].read_text().strip()
    identity = server_identity.read_identity_file(str(host["identity_file"]))
    assert identity.startswith("hmac-sha256:")
    assert mode_of(host["key_file"]) == 0o600 and mode_of(host["identity_file"]) == 0o600
    assert mode_of(host["state_file"]) == 0o600
    assert json.loads(host["state_file"].read_text())["config_hash"] == identity
    for path, text in readable_by_others(host["etc"].parent).items():
        for value in (legacy, API_KEY, key, identity):
            assert value not in text, f"{path} holds {value}"

    again = service(host, raw)
    assert again["changed"] is False and again["action"] == "none", again
    assert again["pid"] == server and earlier.poll() is None

    # A new API key: the same argv and environment, another launch.
    rotated = {**raw, "secrets": {"api_key": "sk-kimi-rotated-9876"}}
    restarted = service(host, rotated)
    assert restarted["action"] == "restarted" and restarted["previous_identity"] == "other"
    wait_for(lambda: earlier.poll() is not None, 15)
    new_state = json.loads(host["state_file"].read_text())
    new_identity = server_identity.read_identity_file(str(host["identity_file"]))
    assert new_identity not in (identity, None)
    assert process_env(restarted["pid"])["KIMI_SERVER_CONFIG_HASH"] == new_identity
    assert new_state["config_hash"] == new_identity and mode_of(host["state_file"]) == 0o600
    assert server_identity.read_identity_file(str(host["identity_file"])) == new_identity
    assert service(host, rotated)["changed"] is False
    stopped = service(host, rotated, state="stopped")
    assert stopped["action"] == "stopped"
