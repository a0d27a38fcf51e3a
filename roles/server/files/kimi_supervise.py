#!/usr/bin/env python3
"""Keep one server process running where systemd is not PID 1 (containers, chroots, test hosts).

    kimi-supervise SPEC.json

SPEC (written by the server role) holds: argv, env_file, identity_file, log_file, pid_file,
state_file, restart_delay_s, restart_max, restart_window_s, stop_timeout_s, file_limit. SPEC and
the environment files are read again before every start, as systemd reads its unit's
EnvironmentFile, so a restart always runs one consistent launch. identity_file (root-only,
written by server_service) holds the launch's keyed identity, KIMI_SERVER_CONFIG_HASH. It
mirrors the systemd unit the role writes elsewhere: EnvironmentFile, Restart=on-failure with a
start limit, raised open-file limit, and a stop that ends the whole process group (SGLang forks
one worker per GPU; killing only the launcher would leave them holding GPU memory).

The pid file holds the supervisor's pid and an exclusive lock while it runs, so a second copy
exits at once. The state file (JSON) says what the server is doing: starting, running,
backoff, gave-up, exited or stopped, with the server's pid, restart count, last exit code and
identity; it is root-only, as the identity is.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

BASE_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "HOME", "TZ")
CONFIG_HASH_KEY = "KIMI_SERVER_CONFIG_HASH"


def read_env_file(path: str) -> dict[str, str]:
    """KEY=value lines, values optionally double-quoted: the subset of systemd's
    EnvironmentFile syntax the role writes."""
    environment = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        (item,) = shlex.split(line)
        key, _, value = item.partition("=")
        environment[key] = value
    return environment


class Supervisor:
    def __init__(self, spec_file: str):
        self.spec_file = spec_file
        self.spec = load_spec(spec_file)
        self.child: subprocess.Popen | None = None
        self.stopping = False
        self.restarts = 0
        self.restart_times: list[float] = []
        self.state: dict = {"supervisor_pid": os.getpid(), "restarts": 0, "last_exit": None}

    def open_log(self):
        """The log, for appending; created root-only: the server's first lines carry its API
        key (SGLang logs its resolved arguments)."""
        fd = os.open(self.spec["log_file"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        return os.fdopen(fd, "ab")

    def log(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with self.open_log() as handle:
            handle.write(f"[{stamp}] [kimi-supervise] {message}\n".encode())

    def write_state(self, status: str, **extra) -> None:
        self.state.update(status=status, updated_at=time.time(), **extra)
        path = Path(self.spec["state_file"])
        tmp = path.with_suffix(".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(self.state))
        os.replace(tmp, path)

    def start_child(self) -> None:
        try:
            self.spec = load_spec(self.spec_file)
            environment = {k: os.environ[k] for k in BASE_ENV_KEYS if k in os.environ}
            environment.update(read_env_file(self.spec["env_file"]))
            # The launch's identity travels in the server's own environment (see
            # server_service); a missing file means an unknown launch, which the next deploy
            # restarts, as systemd's EnvironmentFile=- does.
            identity_file = self.spec.get("identity_file")
            if identity_file and os.path.exists(identity_file):
                environment.update(read_env_file(identity_file))
        except (OSError, ValueError) as error:
            self.log(f"cannot read the launch: {error}")
            self.child = None
            return
        self.state["config_hash"] = environment.get(CONFIG_HASH_KEY, "")
        log = self.open_log()  # the child keeps it open
        try:
            self.child = subprocess.Popen(
                self.spec["argv"],
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.spec.get("working_dir") or "/",
                start_new_session=True,
            )
        except OSError as error:
            self.log(f"cannot start {self.spec['argv'][0]}: {error}")
            self.child = None
        finally:
            log.close()
        if self.child is not None:
            self.log(f"started server pid {self.child.pid}")
            self.write_state("running", child_pid=self.child.pid, started_at=time.time())

    def signal_group(self, signum: int) -> None:
        if self.child is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.child.pid, signum)

    def stop_child(self) -> None:
        if self.child is None or self.child.poll() is not None:
            return
        self.signal_group(signal.SIGTERM)
        try:
            self.child.wait(timeout=float(self.spec.get("stop_timeout_s", 120)))
        except subprocess.TimeoutExpired:
            self.log("server did not stop in time; killing its process group")
        # Workers may outlive the launcher: end the whole group either way.
        self.signal_group(signal.SIGKILL)
        self.child.wait()

    def on_term(self, signum, frame) -> None:
        self.stopping = True

    def may_restart(self) -> bool:
        window = float(self.spec.get("restart_window_s", 3600))
        now = time.monotonic()
        self.restart_times = [t for t in self.restart_times if now - t < window]
        return len(self.restart_times) < int(self.spec.get("restart_max", 3))

    def sleep_unless_stopping(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_term)
        signal.signal(signal.SIGINT, self.on_term)
        limit = int(self.spec.get("file_limit", 0) or 0)
        if limit:
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            target = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, max(target, hard)))
        self.write_state("starting")
        self.start_child()
        while not self.stopping:
            code = self.child.poll() if self.child is not None else 1
            if code is None:
                time.sleep(0.2)
                continue
            self.state["last_exit"] = code
            # The launcher is gone; its workers must not keep the GPUs.
            self.signal_group(signal.SIGKILL)
            if code == 0:
                self.log("server exited with status 0; not restarting (on-failure policy)")
                self.write_state("exited", child_pid=None)
                return 0
            if not self.may_restart():
                self.log(
                    f"server exited with status {code}; restart limit reached "
                    f"({self.spec.get('restart_max', 3)} in {self.spec.get('restart_window_s')} s)"
                )
                self.write_state("gave-up", child_pid=None)
                return 1
            self.restart_times.append(time.monotonic())
            self.restarts += 1
            self.state["restarts"] = self.restarts
            delay = float(self.spec.get("restart_delay_s", 10))
            self.log(f"server exited with status {code}; restart {self.restarts} in {delay} s")
            self.write_state("backoff", child_pid=None)
            self.sleep_unless_stopping(delay)
            if not self.stopping:
                self.start_child()
        self.log("stopping server")
        self.stop_child()
        self.write_state("stopped", child_pid=None)
        return 0


def load_spec(path: str) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    spec = load_spec(argv[1])
    pid_file = open(spec["pid_file"], "a+", encoding="utf-8")  # noqa: SIM115 - held for life
    try:
        fcntl.lockf(pid_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(f"another supervisor holds {spec['pid_file']}", file=sys.stderr)
        return 3
    pid_file.seek(0)
    pid_file.truncate()
    pid_file.write(f"{os.getpid()}\n")
    pid_file.flush()
    try:
        return Supervisor(argv[1]).run()
    finally:
        pid_file.seek(0)
        pid_file.truncate()
        pid_file.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
