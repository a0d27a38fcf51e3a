"""The stdout callback kimi_readable with the notification callback kimi_progress, as Ansible
drives them: each event goes to the stdout callback first, then to kimi_progress. Fake task
results stand in for a polled status module; the assertions are on what the screen shows."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from ansible.executor.task_result import CallbackTaskResult
from ansible.inventory.host import Host
from ansible.playbook.play import Play
from ansible.playbook.task import Task
from ansible.plugins.loader import callback_loader

from tests.support.ansible_run import local_playbook, run_local_playbook

REPO = Path(__file__).resolve().parents[2]
callback_loader.add_directory(str(REPO / "callback_plugins"))

RETRY_NOISE = "FAILED - RETRYING"


def load(name: str, **options):
    callback = callback_loader.get(name)
    assert callback is not None, f"{name} not found in callback_plugins/"
    callback.set_options(direct=options or None)
    return callback


def progress_line(progress):
    # The plugin loader imports kimi_progress; its helper is read from that very module.
    return sys.modules[type(load("kimi_progress")).__module__].progress_line(progress)


class Screen:
    """One play's events sent to a stdout callback and kimi_progress, in Ansible's order."""

    def __init__(self, capsys, stdout: str = "kimi_readable", verbosity: int = 0, **options):
        self.capsys = capsys
        self.callbacks = [load(stdout, **options), load("kimi_progress")]
        for callback in self.callbacks:
            # Display is process-wide: set it back before another test's callbacks print.
            callback._display.verbosity = verbosity
        self.play = Play.load({"name": "Deploy", "hosts": "all", "gather_facts": False})
        self.send("v2_playbook_on_play_start", self.play)
        capsys.readouterr()

    def send(self, event: str, *args) -> None:
        for callback in self.callbacks:
            if hasattr(callback, event):
                getattr(callback, event)(*args)

    def task(self, name: str) -> Task:
        task = Task.load({"name": name, "debug": {"msg": "polled"}})
        self.send("v2_playbook_on_task_start", task, False)
        return task

    def retry(self, host: str, task: Task, attempt: int, **result) -> None:
        result = {"failed": True, "attempts": attempt, "retries": 11, **result}
        self.send("v2_runner_retry", CallbackTaskResult(Host(host), task, result, {}))

    def lines(self) -> list[str]:
        return self.capsys.readouterr().out.splitlines()


@pytest.fixture(autouse=True)
def quiet_display():
    yield
    load("kimi_progress")._display.verbosity = 0


def test_retries_with_progress_show_each_new_line_once_and_no_retry_noise(capsys):
    screen = Screen(capsys)
    task = screen.task("Wait for the download")
    capsys.readouterr()
    polls = ["waiting for the download", "1.0 GB of 595 GB", "1.0 GB of 595 GB", "2.5 GB of 595 GB"]
    for attempt, progress in enumerate(polls, start=1):
        screen.retry("gpu1", task, attempt, progress=progress)
    assert screen.lines() == [
        "  [gpu1] waiting for the download",
        "  [gpu1] 1.0 GB of 595 GB",
        "  [gpu1] 2.5 GB of 595 GB",
    ]


def test_each_host_and_each_task_keeps_its_own_last_line(capsys):
    screen = Screen(capsys)
    download = screen.task("Wait for the download")
    capsys.readouterr()
    screen.retry("gpu1", download, 1, progress="10%")
    screen.retry("gpu2", download, 1, progress="10%")
    screen.retry("gpu1", download, 2, progress="10%")
    screen.retry("gpu2", download, 2, progress="20%")
    assert screen.lines() == ["  [gpu1] 10%", "  [gpu2] 10%", "  [gpu2] 20%"]
    # The same words in the next task are news: that task has shown nothing yet.
    load_task = screen.task("Wait for the server")
    screen.retry("gpu1", load_task, 1, progress="10%")
    lines = screen.lines()
    assert lines[-1] == "  [gpu1] 10%"
    assert "TASK [Wait for the server]" in lines[-2]


@pytest.mark.parametrize("progress", [None, "", "   \n", 42, {"done": 1}, ["1 GB"]])
def test_retries_without_a_progress_line_say_once_that_the_host_waits(capsys, progress):
    screen = Screen(capsys)
    task = screen.task("Wait for /health")
    capsys.readouterr()
    extra = {} if progress is None else {"progress": progress}
    for attempt in range(1, 5):
        screen.retry("gpu1", task, attempt, **extra)
    screen.retry("gpu2", task, 1, **extra)
    assert screen.lines() == [
        "  [gpu1] waiting: Wait for /health (up to 11 attempts)",
        "  [gpu2] waiting: Wait for /health (up to 11 attempts)",
    ]
    again = screen.task("Wait for /health")
    screen.retry("gpu1", again, 1, **extra)
    assert screen.lines()[-1] == "  [gpu1] waiting: Wait for /health (up to 11 attempts)"


def test_a_task_that_starts_reporting_progress_shows_the_wait_then_the_progress(capsys):
    screen = Screen(capsys)
    task = screen.task("Wait for the server")
    capsys.readouterr()
    screen.retry("gpu1", task, 1)
    screen.retry("gpu1", task, 2)
    screen.retry("gpu1", task, 3, progress="loading: 12 of 64 shards")
    assert screen.lines() == [
        "  [gpu1] waiting: Wait for the server (up to 11 attempts)",
        "  [gpu1] loading: 12 of 64 shards",
    ]


def test_a_progress_line_from_the_host_cannot_drive_the_terminal_or_flood_it(capsys):
    screen = Screen(capsys)
    task = screen.task("Wait for the download")
    capsys.readouterr()
    screen.retry("gpu1", task, 1, progress="50%\x1b[2J\x1b[H\r\nfake: [gpu2] ok\x07\x9b31m")
    screen.retry("gpu1", task, 2, progress="x" * 5000)
    first, second = screen.lines()
    assert first == "  [gpu1] 50%?[2J?[H fake: [gpu2] ok??31m"
    assert second == "  [gpu1] " + "x" * 299 + "\u2026"
    assert progress_line("  a\tb  ") == "a b"


def test_results_print_as_the_default_callback_prints_them(capsys):
    def shown(stdout: str) -> list[str]:
        screen = Screen(capsys, stdout=stdout)
        task = screen.task("Wait for the server")
        gpu1, gpu2 = Host("gpu1"), Host("gpu2")
        ok = {"changed": False, "attempts": 3, "state": "ready"}
        failed = {"failed": True, "attempts": 11, "msg": "the server died: exit 137"}
        screen.send("v2_runner_on_ok", CallbackTaskResult(gpu1, task, ok, {}))
        screen.send("v2_runner_on_failed", CallbackTaskResult(gpu2, task, failed, {}), False)
        return screen.lines()

    ours, default = shown("kimi_readable"), shown("default")
    assert ours == default
    assert "ok: [gpu1]" in ours
    assert "fatal: [gpu2]: FAILED! => " in ours
    assert any("the server died: exit 137" in line for line in ours)


def test_a_held_back_banner_is_printed_before_the_first_progress_line(capsys):
    # With ok results hidden the default callback prints a task's banner with its first result.
    screen = Screen(capsys, display_ok_hosts=False)
    task = screen.task("Wait for the download")
    assert screen.lines() == []
    screen.retry("gpu1", task, 1, progress="1.0 GB of 595 GB")
    screen.retry("gpu1", task, 2, progress="2.0 GB of 595 GB")
    lines = [line for line in screen.lines() if line]
    assert lines[0].startswith("TASK [Wait for the download] ***")
    assert lines[1:] == ["  [gpu1] 1.0 GB of 595 GB", "  [gpu1] 2.0 GB of 595 GB"]


def test_with_vvv_every_retry_and_its_result_come_back(capsys):
    screen = Screen(capsys, verbosity=3)
    task = screen.task("Wait for the download")
    capsys.readouterr()
    screen.retry("gpu1", task, 1, progress="1.0 GB of 595 GB")
    screen.retry("gpu1", task, 2, progress="1.0 GB of 595 GB")
    lines = screen.lines()
    retries = [line for line in lines if line.startswith(RETRY_NOISE)]
    assert len(retries) == 2
    assert retries[0].startswith(
        "FAILED - RETRYING: [gpu1]: Wait for the download (10 retries left).Result was:"
    )
    assert lines.count("  [gpu1] 1.0 GB of 595 GB") == 1


def test_under_another_stdout_callback_kimi_progress_still_shows_the_progress(capsys):
    # ansible-runner and AWX bring their own stdout callback, built on the default one.
    screen = Screen(capsys, stdout="default")
    task = screen.task("Wait for the download")
    capsys.readouterr()
    for attempt, progress in enumerate(["1.0 GB", "1.0 GB", "2.0 GB"], start=1):
        screen.retry("gpu1", task, attempt, progress=progress)
    assert screen.lines() == [
        "FAILED - RETRYING: [gpu1]: Wait for the download (10 retries left).",
        "  [gpu1] 1.0 GB",
        "FAILED - RETRYING: [gpu1]: Wait for the download (9 retries left).",
        "FAILED - RETRYING: [gpu1]: Wait for the download (8 retries left).",
        "  [gpu1] 2.0 GB",
    ]


POLLED_MODULE = """\
#!/usr/bin/python
import os
from ansible.module_utils.basic import AnsibleModule

module = AnsibleModule(
    argument_spec={
        "counter": {"type": "path", "required": True},
        "plain": {"type": "bool", "default": False},
    }
)
path = module.params["counter"]
polls = int(open(path).read()) + 1 if os.path.exists(path) else 1
with open(path, "w") as handle:
    handle.write(str(polls))
# Two polls in a row report the same shard count: the screen shows it once.
shards = [0, 1, 1, 2, 4][polls - 1]
result = {"changed": False, "done": polls == 5}
if not module.params["plain"]:
    result["progress"] = "%d of 4 shards loaded" % shards
module.exit_json(**result)
"""

PLAYBOOK = """\
- name: A polled task on this machine
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Wait for the server to load
      polled: {counter: "%(counter)s"}
      register: loaded
      until: loaded.done
      retries: 10
      delay: 0
    - name: Wait without progress
      polled: {counter: "%(counter)s.plain", plain: true}
      register: plain
      until: plain.done
      retries: 10
      delay: 0
      changed_when: false
"""


def test_ansible_playbook_with_the_kits_config_shows_progress_without_retry_noise(tmp_path):
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "polled.py").write_text(POLLED_MODULE)
    playbook = tmp_path / "polled.yml"
    playbook.write_text(PLAYBOOK % {"counter": tmp_path / "polls"})
    run = run_local_playbook(playbook, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    assert run.returncode == 0, run.stdout + run.stderr
    assert RETRY_NOISE not in run.stdout
    lines = run.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "TASK [Wait for the server" in line)
    # Banners are as wide as the terminal: compared up to their stars.
    lines = [line.rstrip("*").rstrip() if line.startswith("TASK [") else line for line in lines]
    assert lines[start + 1 : start + 8] == [
        "  [localhost] 0 of 4 shards loaded",
        "  [localhost] 1 of 4 shards loaded",
        "  [localhost] 2 of 4 shards loaded",
        "ok: [localhost]",
        "",
        "TASK [Wait without progress]",
        "  [localhost] waiting: Wait without progress (up to 11 attempts)",
    ]
    assert textwrap.dedent("""\
        localhost                  : ok=2    changed=0    unreachable=0    failed=0""") in (
        run.stdout
    )


PROBE_FILTER = """\
import os


def _loaded_in(path):
    with open(path, "a") as handle:
        handle.write("%d\\n" % os.getpid())


_loaded_in(os.environ["KIT_FILTER_PROBE"])


class FilterModule:
    def filters(self):
        return {"probed": lambda value: "probed " + value}
"""

FILTERED_PLAYBOOK = """\
- name: Tasks whose templates use filters
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Use the probe filter
      ansible.builtin.debug:
        msg: "{{ 'one' | probed }}"
    - name: Use it again
      ansible.builtin.debug:
        msg: "{{ 'two' | probed }} {{ 'ddtree-tp4-b32' | kimi_config_base }}"
    - name: And again
      ansible.builtin.debug:
        msg: "{{ 'three' | probed }}"
"""


def test_filter_plugins_are_loaded_once_before_the_workers_fork(tmp_path):
    """kimi_progress loads every filter plugin in ansible-playbook's own process: each task's
    worker is forked from it and finds them loaded, instead of importing every filter file
    (the kit's pull in much of module_utils/) once per task and host."""
    plugins = tmp_path / "filter_plugins"
    plugins.mkdir()
    (plugins / "probe_filters.py").write_text(PROBE_FILTER)
    playbook = tmp_path / "filtered.yml"
    playbook.write_text(FILTERED_PLAYBOOK)
    loads = tmp_path / "loads"
    argv, env = local_playbook(
        playbook,
        ANSIBLE_FILTER_PLUGINS=f"{REPO / 'filter_plugins'}:{plugins}",
        KIT_FILTER_PROBE=str(loads),
    )
    run = subprocess.Popen(
        argv,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    stdout, _ = run.communicate(timeout=180)
    assert run.returncode == 0, stdout
    assert '"msg": "probed two ddtree"' in stdout or "msg: probed two ddtree" in stdout, stdout
    assert loads.read_text().split() == [str(run.pid)]


def test_a_failure_is_printed_once_and_a_rescue_prints_only_what_it_adds(capsys):
    """A rescue that repeats a failure for its callers, or only restates it, adds one line.
    (That the [ERROR] block does not repeat the fatal line's message is proven on a real run:
    tests/integration/test_settings_check.py counts each message once.)"""
    screen = Screen(capsys)
    task = screen.task("Start the server")
    error = "the server did not become healthy in 3600 s: CUDA out of memory"
    failed = {"failed": True, "msg": error}
    screen.send("v2_runner_on_failed", CallbackTaskResult(Host("gpu1"), task, failed, {}), False)
    rescue = Task.load({"name": "Stop after the failed start", "fail": {"msg": "x"}})
    screen.send("v2_playbook_on_task_start", rescue, False)
    repeated = {"failed": True, "msg": error + " It had just moved to a new runtime."}
    screen.send(
        "v2_runner_on_failed", CallbackTaskResult(Host("gpu1"), rescue, repeated, {}), False
    )
    stop = Task.load(
        {"name": "Stop the rollout", "fail": {"msg": "x"}, "vars": {"kimi_restates_failure": True}}
    )
    screen.send("v2_playbook_on_task_start", stop, False)
    restated = {"failed": True, "msg": 'gpu1 stopped at "Start the server" (its error is above).'}
    screen.send("v2_runner_on_failed", CallbackTaskResult(Host("gpu1"), stop, restated, {}), False)
    out = "\n".join(screen.lines())
    assert out.count("CUDA out of memory") == 1, out
    assert "  [gpu1] (the error above) It had just moved to a new runtime." in out
    assert '  [gpu1] gpu1 stopped at "Start the server" (its error is above).' in out
    assert out.count("FAILED!") == 1


def test_the_settings_check_reads_the_kit_files_once_before_the_workers_fork():
    """At the check's task start kimi_progress fills the plugin's caches (the roles' specs,
    the group_vars names, every role's defaults) in ansible-playbook's own process: each
    host's worker is forked from it and reads none of those files again."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import action_loader

    action_loader.add_directory(str(REPO / "action_plugins"))
    progress = sys.modules[type(load("kimi_progress")).__module__]
    plugin = sys.modules[action_loader.get("kimi_settings_check", class_only=True).__module__]
    plugin._cache.clear()
    progress.warm_action("ansible.builtin.debug")
    assert plugin._cache == {}
    progress.warm_action("kimi_settings_check")
    assert {"options", "group_vars", "defaults"} <= set(plugin._cache)
    defaults = plugin._cache["defaults"]
    assert "server_health_poll_s" in defaults and "weights_poll_interval" in defaults
    # A worker's call finds them: the same objects, no file read again.
    assert plugin._role_defaults(DataLoader()) is defaults
