"""Helpers every module that works on a host needs, written once: files written whole or not at
all, JSON and text read without raising, a program's marked JSON report, file hashes, whether
systemd runs the host, a unit's state, stopping a process group, and masking secrets.

Standard library only: modules ship it to hosts with themselves (AnsiballZ), and the hosts'
Pythons may be 3.10.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import tempfile
import time

# What Ansible itself shows for a no_log value: one mask string for everything the kit hides.
MASK = "********"
# Keys whose values are secrets: api_key, hf_token, x-api-key, password... but not
# tokenizer_path or max_prefill_tokens, which only contain the letters.
SECRET_KEY = re.compile(
    r"(?:^|[_\-.])(?:api[_\-]?key|key|token|secret|password|passwd|auth|authorization)(?:$|[_\-.])",
    re.IGNORECASE,
)


def atomic_write(path: str, data: bytes | str, mode: int = 0o644) -> None:
    """`path` holds `data` with `mode`, or is left as it was: never half written, never with
    looser permissions for a moment (the temporary file is created 0600 in the same folder)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write_json_atomic(path: str, data, mode: int = 0o644) -> None:
    """JSON (indent 1, a final newline) written with atomic_write."""
    atomic_write(path, json.dumps(data, indent=1) + "\n", mode)


def read_json(path: str):
    """The file's JSON, or None when it is missing, unreadable or not JSON."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def read_text(path: str) -> str | None:
    """The file's text, stripped, or None when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# A report line longer than this is not one of the kit's programs' reports: refused unread.
MARKED_JSON_MAX_CHARS = 1 << 20


def marked_json(output: str, marker: str, max_chars: int = MARKED_JSON_MAX_CHARS) -> dict | None:
    """The JSON object a program printed as its report, `marker` + JSON on one line, or None
    when there is no such line, or the last one is over max_chars, not JSON, or not an object.
    The last marked line counts: a program reports when it is done, after anything it imported
    may have printed."""
    line = None
    for candidate in output.splitlines():
        if candidate.startswith(marker):
            line = candidate
    if line is None or len(line) - len(marker) > max_chars:
        return None
    try:
        record = json.loads(line[len(marker) :])
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def systemd_is_pid1(root: str = "/") -> bool:
    """Whether systemd runs this host, as sd_booted(3) decides it: /run/systemd/system exists.
    The server role's own check (roles/server/tasks/manager.yml) and the benchmark's log
    reader ask the same question the same way."""
    return os.path.isdir(os.path.join(root, "run/systemd/system"))


def parse_unit_show(text: str) -> dict[str, str]:
    """`systemctl show -p A -p B ...` output (A=value lines) as a dict."""
    return dict(line.partition("=")[::2] for line in text.splitlines() if "=" in line)


def unit_state(run, unit: str, properties: tuple[str, ...], systemctl: str = "systemctl") -> dict:
    """The unit's properties; run(argv) -> (rc, stdout, stderr). Raises RuntimeError naming the
    unit when systemctl fails (a unit that does not exist is LoadState=not-found, not a failure)."""
    rc, out, err = run([systemctl, "show", unit, "-p", ",".join(properties)])
    if rc != 0:
        raise RuntimeError(f"`systemctl show {unit}` exited {rc}: {(err or out).strip()}")
    return parse_unit_show(out)


def pid_alive(pid: int | None) -> bool:
    """Whether a process runs: a zombie has exited, only its parent has not collected it."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def kill_process_group(pgid: int | None, grace_s: float = 10.0) -> None:
    """SIGTERM the process group, give it `grace_s` to go, then SIGKILL what is left. A group
    that is already gone, or one we may not signal, is left alone."""
    if not pgid or pgid <= 1:
        return
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def mask_secrets(value, secrets: list[str] | tuple[str, ...] = ()):
    """A copy with the values of secret-looking keys and every occurrence of the given secret
    values replaced by MASK; empty values stay (an empty key is no secret, and says so)."""
    if isinstance(value, dict):
        return {
            key: (
                MASK
                if SECRET_KEY.search(str(key)) and item not in (None, "", False)
                else mask_secrets(item, secrets)
            )
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [mask_secrets(item, secrets) for item in value]
    if isinstance(value, str):
        for secret in secrets:
            if secret:
                value = value.replace(secret, MASK)
    return value
