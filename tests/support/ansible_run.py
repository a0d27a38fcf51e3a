"""Runs playbooks the way the tests need them: through ansible-runner, reading its events."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import ansible_runner

REPO = Path(__file__).resolve().parents[2]


@dataclass
class PlaybookRun:
    rc: int
    status: str
    events: list[dict]
    stats: dict
    stdout: str
    private_dir: Path

    def results(self, task: str) -> dict[str, dict]:
        """Per host, the result of the task with that name (ok, changed or failed)."""
        return self.last_results(task)

    def last_results(self, *tasks: str) -> dict[str, dict]:
        """Per host, the result of whichever of those tasks ran last (ok, changed or failed)."""
        found = {}
        for event in self.events:
            data = event.get("event_data", {})
            if data.get("task") in tasks and event["event"] in (
                "runner_on_ok",
                "runner_on_failed",
                "runner_on_unreachable",
            ):
                result = dict(data.get("res", {}))
                result["failed"] = event["event"] != "runner_on_ok"
                found[data["host"]] = result
        return found

    def server_health(self) -> dict[str, dict]:
        """Per host, the server role's last health poll: the wait for /health_generate, or the
        wait for the load where that poll saw the server generate already."""
        return self.last_results("Wait for the server to load", "Wait for /health_generate")

    def changed(self) -> dict[str, int]:
        return dict(self.stats.get("changed", {}))

    def failed_hosts(self) -> set[str]:
        return set(self.stats.get("failures", {})) | set(self.stats.get("dark", {}))

    def changed_tasks(self) -> dict[str, list[str]]:
        """Per host, the tasks that reported a change."""
        found: dict[str, list[str]] = {}
        for event in self.events:
            data = event.get("event_data", {})
            if event["event"] == "runner_on_ok" and data.get("res", {}).get("changed"):
                found.setdefault(data["host"], []).append(data.get("task", "?"))
        return found

    def assert_unchanged(self) -> None:
        """What a second run must show: success first (a run that failed early changes nothing
        too), then no change on any host."""
        failed = sorted(self.failed_hosts())
        assert self.rc == 0 and not failed, (
            f"the run failed (rc {self.rc}, hosts {failed}):\n{self.stdout[-8000:]}"
        )
        changed = {host: count for host, count in self.changed().items() if count}
        assert not changed, f"changes on {changed}: {self.changed_tasks()}"


def run_playbook(
    playbook: str | Path,
    inventory: str | Path,
    private_dir: Path,
    extravars: dict | None = None,
    envvars: dict | None = None,
    check: bool = False,
    limit: str | None = None,
    verbosity: int = 0,
    vars_files: list[Path] | None = None,
    tags: str | None = None,
) -> PlaybookRun:
    """`vars_files` are handed over as `-e @FILE`: for secrets, which ansible-runner would
    otherwise write into its env/extravars file. `tags`: ansible-playbook's --tags.
    extravars {"kimi_lock_file": None} leaves the study lock where the kit puts it."""
    extravars = {
        # Each run its own study lock unless a test shares one: a lock left in the checkout
        # would pin the next test's run.
        "kimi_lock_file": str(private_dir / "kimi.lock.yml"),
        # plan.yml resolves the git ref of the DDTree runtime: never the public repository.
        "kimi_sglang_git": local_sglang_git(),
        **(extravars or {}),
    }
    if extravars["kimi_lock_file"] is None:
        del extravars["kimi_lock_file"]
    playbook = Path(playbook)
    if not playbook.is_absolute():
        playbook = REPO / playbook
    env = {
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        # ansible-runner starts ansible-playbook from PATH: the one in this venv.
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
        # ansible-runner puts its own callback folder in this variable, which hides
        # ansible.cfg's callback_plugins; it keeps what is already there, so name ours.
        "ANSIBLE_CALLBACK_PLUGINS": str(REPO / "callback_plugins"),
        **controller_bytecode(),
        **(envvars or {}),
    }
    cmdline = ["--check", "--diff"] if check else []
    cmdline += [f"-e @{path}" for path in vars_files or ()]
    # Inherited rather than given as envvars (written to env/envvars). ansible-runner still
    # records the whole environment in artifacts/<id>/command, so tests hand tokens over in a
    # file (tests.support.hub_server.token_env), never in the environment.
    with patched_environ(env):
        runner = ansible_runner.run(
            private_data_dir=str(private_dir),
            project_dir=str(REPO),
            playbook=str(playbook),
            inventory=str(inventory),
            extravars=extravars,
            cmdline=" ".join(cmdline) if cmdline else None,
            limit=limit,
            tags=tags,
            verbosity=verbosity or None,
            quiet=True,
            timeout=900,
        )
    stdout = runner.stdout.read() if runner.stdout else ""
    return PlaybookRun(
        rc=runner.rc,
        status=runner.status,
        events=list(runner.events),
        stats=runner.stats or {},
        stdout=stdout,
        private_dir=private_dir,
    )


def controller_bytecode() -> dict[str, str]:
    """The environment under which the modules a playbook runs on this machine keep their
    payloads' bytecode, and ansible-playbook what module_utils files import, the code its
    templates compile to, the payloads it builds and what YAML files load to, its task
    workers leave its objects alone, its loaded files are copied by unpickling and the tasks
    that never reach a host run without a worker (tests/support/controller_site/
    sitecustomize.py). KIT_TEST_INLINE_TASKS=0 in this process's environment turns the last
    off, to measure it."""
    state = REPO / "tests" / ".state"
    (state / "controller-bytecode").mkdir(parents=True, exist_ok=True)
    site = str(REPO / "tests" / "support" / "controller_site")
    path = os.environ.get("PYTHONPATH")
    return {
        "KIT_TEST_BYTECODE_DIR": str(state / "controller-bytecode"),
        "KIT_TEST_ANSIBALLZ_DEPS_DIR": str(state / "ansiballz-deps"),
        "KIT_TEST_JINJA_CODE_DIR": str(state / "jinja-code"),
        "KIT_TEST_ANSIBALLZ_PAYLOAD_DIR": str(state / "ansiballz-payloads"),
        "KIT_TEST_YAML_DIR": str(state / "yaml"),
        "KIT_TEST_WORKER_GC": "1",
        "KIT_TEST_LOADER_COPIES": "1",
        "KIT_TEST_INLINE_TASKS": os.environ.get("KIT_TEST_INLINE_TASKS", "1"),
        "PYTHONPATH": f"{site}{os.pathsep}{path}" if path else site,
    }


# What this shell may say about callbacks, which the kit's ansible.cfg says for the playbooks
# the unit tests run here.
SHELL_CALLBACK_SETTINGS = frozenset(
    f"ANSIBLE_{name}" for name in ("STDOUT_CALLBACK", "CALLBACK_PLUGINS", "CALLBACKS_ENABLED")
)


def cache_env(variable: str, value) -> dict[str, str]:
    """This process's environment under the kit's ansible.cfg, for the unit tests of one of the
    harness's caches, without this shell's callback settings: without value, none of them;
    with it, all of them (controller_bytecode),
    `variable` set to value (a cache's folder; a switch's 1 or 0: KIT_TEST_WORKER_GC,
    KIT_TEST_LOADER_COPIES, KIT_TEST_INLINE_TASKS)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("KIT_TEST_") and k not in SHELL_CALLBACK_SETTINGS
    }
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    if value:
        env.update(controller_bytecode())
        env[variable] = str(value)
    return env


def local_sglang_git() -> dict:
    """kimi_sglang_git for runs that do not name one: a bare repository laid out like SGLang's
    with the DDTree pull-request ref (tests/support/fake_sglang.py), built once per checkout."""
    import fcntl
    import json

    from tests.support.fake_sglang import build_git_source

    folder = REPO / "tests" / ".state" / "default-sglang-git"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / ".default-sglang-git.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        record = folder / "source.json"
        if not record.is_file():
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            source = build_git_source(folder)
            record.write_text(json.dumps(source))
        source = json.loads(record.read_text())
    return {"url": source["url"], "ref": source["ref"], "patches": []}


@contextlib.contextmanager
def patched_environ(values: dict[str, str]):
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def with_extra_args(*args: str) -> str:
    """kimi_server_settings as the deploy computes it, with the user's extra flags: a
    server_settings extra var."""
    extra = json.dumps(list(args))
    return "{{ kimi_server_settings | combine({'extra_args': " + extra + "}) }}"


def python_json(code: str, env: dict[str, str], timeout_s: float = 120) -> dict:
    """What a Python program run in the checkout prints as JSON on its last line: the unit
    tests of the harness's caches run ansible-core in a process of its own, which they patch."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def local_playbook(
    playbook: Path, inventory: str = "localhost,", extra_args: tuple[str, ...] = (), **env: str
) -> tuple[list[str], dict[str, str]]:
    """argv and environment of ansible-playbook running playbook (on localhost unless given an
    inventory, with extra_args before the playbook) under the kit's ansible.cfg: what it says
    about callbacks, not what this shell may say; a callback setting in `env` is the caller's
    and stays."""
    shell = {k: v for k, v in os.environ.items() if k not in SHELL_CALLBACK_SETTINGS}
    env = {**shell, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), **env}
    argv = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i",
        inventory,
        "-e",
        f"ansible_python_interpreter={sys.executable}",
        *extra_args,
        str(playbook),
    ]
    return argv, env


def run_switch_probe(
    tmp_path: Path,
    variable: str,
    on: bool,
    files: dict[str, str],
    inventory: str = "localhost,",
    extra_args: tuple[str, ...] = (),
    **env: str,
) -> str:
    """The output of probe.yml (among `files`, {path under tmp_path: text}, with any plugins
    it needs) run on localhost (or `inventory`, with extra_args and env as local_playbook
    takes them) with every harness cache but `variable`, a switch, on or off."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    env = {**cache_env(variable, "1" if on else "0"), "ANSIBLE_NOCOLOR": "1", **env}
    done = run_local_playbook(
        tmp_path / "probe.yml", inventory=inventory, extra_args=extra_args, **env
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def assert_start_patched_once(patch, task=None) -> None:
    """`patch` applied twice to a module with a WorkerProcess (whose task is `task`, one that
    must fork) wraps its start once, and the wrapped start still starts the worker."""
    import types

    calls = []

    class WorkerProcess:
        _task = task

        def start(self):
            calls.append("start")

    module = types.SimpleNamespace(WorkerProcess=WorkerProcess)
    patch(module)
    wrapped = WorkerProcess.start
    patch(module)
    assert WorkerProcess.start is wrapped
    WorkerProcess().start()
    assert calls == ["start"]


def run_local_playbook(
    playbook: Path,
    timeout_s: float = 180,
    inventory: str = "localhost,",
    extra_args: tuple[str, ...] = (),
    **env: str,
):
    """ansible-playbook on localhost (local_playbook), run to its end within timeout_s."""
    argv, environ = local_playbook(playbook, inventory, extra_args, **env)
    return subprocess.run(
        argv,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
