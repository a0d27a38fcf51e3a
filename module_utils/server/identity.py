"""Which launch a server runs, as a keyed identity that says nothing about the API key.

The identity of a launch is HMAC-SHA256 over its argv, environment and secrets, keyed with a
random key that is made on the host, kept in a root-only file and never leaves it. Without the
key, nobody can test guesses of a secret against the identity, so the identity may travel in
the server's own environment (where server_service reads it back) and in the supervisor's
state; it still stays out of every file others can read.

Kits before this one recorded `sha256(to_json([argv, environment, secrets], sort_keys=true))`,
unkeyed, in world-readable files: a dictionary attack on it finds a weak API key. A server
started then still carries that value; legacy_hash() recomputes it (byte for byte as Ansible's
to_json and hash filters did) so that such a server, when it runs exactly the wanted launch, is
kept running and only its records are rewritten.

Standard library only: it ships to the hosts with the module.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import stat

from ansible.module_utils.host.helpers import SECRET_KEY, atomic_write, read_json

# The variable in the server's environment that holds its identity (the name is older than
# the keyed value; legacy servers hold their unkeyed hash under it).
IDENTITY_VARIABLE = "KIMI_SERVER_CONFIG_HASH"
KEYED_PREFIX = "hmac-sha256:"
LEGACY_HASH = re.compile(r"^[0-9a-f]{64}$")
KEY_BYTES = 32
KEY_TEXT = re.compile(r"^[0-9a-f]{64}$")
# Bounds on what is read back from files and the module's input.
MAX_LAUNCH_CHARS = 1 << 20


class IdentityError(ValueError):
    """A launch or a key file that cannot be used; the message says what to fix."""


def parse_launch(text: str) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """argv, environment and secrets from the module's JSON input, type-checked."""
    if not isinstance(text, str) or len(text) > MAX_LAUNCH_CHARS:
        raise IdentityError("launch must be a JSON object of at most 1 MiB")
    try:
        launch = json.loads(text)
    except ValueError as error:
        raise IdentityError(f"launch is not JSON: {error.msg}") from None
    if not isinstance(launch, dict):
        raise IdentityError("launch must be a JSON object with argv, environment and secrets")
    argv = launch.get("argv")
    environment = launch.get("environment") or {}
    found_secrets = launch.get("secrets") or {}
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise IdentityError("launch.argv must be a non-empty list of strings")
    for name, mapping in (("environment", environment), ("secrets", found_secrets)):
        if not isinstance(mapping, dict) or not all(isinstance(k, str) for k in mapping):
            raise IdentityError(f"launch.{name} must be a mapping with string keys")
    for key, value in environment.items():
        if not isinstance(value, str):
            raise IdentityError(f"launch.environment.{key} must be a string")
    return argv, environment, found_secrets


def ansible_to_json_sorted(value) -> str:
    """What `value | to_json(sort_keys=true)` gives in ansible-core 2.19 for plain JSON data:
    json.dumps with its defaults (ASCII escapes, ', ' and ': ' separators)."""
    return json.dumps(value, sort_keys=True)


def legacy_hash(argv: list, environment: dict, found_secrets: dict) -> str:
    """The unkeyed hash earlier kits recorded, for recognising a server they started."""
    text = ansible_to_json_sorted([argv, environment, found_secrets])
    # The hash filter encodes with surrogate_or_strict: UTF-8 for any text JSON can hold here.
    return hashlib.sha256(text.encode("utf-8", errors="surrogateescape")).hexdigest()


def keyed_identity(key: bytes, argv: list, environment: dict, found_secrets: dict) -> str:
    message = json.dumps(
        [argv, environment, found_secrets], sort_keys=True, separators=(",", ":")
    ).encode()
    return KEYED_PREFIX + hmac.new(key, message, hashlib.sha256).hexdigest()


def load_key(path: str, create: bool) -> bytes | None:
    """The host's identity key, made on first use (0600, O_EXCL: two runs at once agree on
    one); None when it does not exist and create is false (check mode)."""
    if create:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w", encoding="ascii") as handle:
                handle.write(secrets.token_hex(KEY_BYTES) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise IdentityError(
            f"cannot read the server identity key {path}: {error.strerror}. Fix: remove it; "
            "the next run makes a new one (the server then restarts once)"
        ) from None
    with os.fdopen(fd, "r", encoding="ascii", errors="replace") as handle:
        info = os.fstat(handle.fileno())
        text = handle.read(KEY_BYTES * 2 + 2).strip()
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = "is not a regular file"
    elif info.st_mode & 0o077:
        # Someone else may have read it: a key others know proves nothing.
        problem = f"is readable by others (mode {stat.S_IMODE(info.st_mode):04o})"
    elif info.st_uid != os.geteuid():
        problem = f"belongs to uid {info.st_uid}, not to uid {os.geteuid()}"
    elif not KEY_TEXT.match(text):
        problem = "does not hold a key (64 hexadecimal digits)"
    if problem:
        raise IdentityError(
            f"the server identity key {path} {problem}. Fix: remove it; the next run makes a "
            "new one (the server then restarts once)"
        )
    return bytes.fromhex(text)


def match(running: str | None, wanted: str | None, legacy: str) -> str:
    """How the running server's identity compares with the wanted launch: none (no identity),
    current (the keyed identity), legacy (an earlier kit's unkeyed hash of this very launch) or
    other (any other launch, or a key that changed)."""
    if not running:
        return "none"
    if running.startswith(KEYED_PREFIX):
        return "current" if wanted and hmac.compare_digest(running, wanted) else "other"
    if LEGACY_HASH.match(running) and hmac.compare_digest(running, legacy):
        return "legacy"
    return "other"


def identity_file_text(identity: str) -> str:
    # The EnvironmentFile syntax systemd and kimi-supervise both read.
    return f'{IDENTITY_VARIABLE}="{identity}"\n'


def read_identity_file(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(4096)
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.strip().partition("=")
        if name == IDENTITY_VARIABLE:
            return value.strip('"') or None
    return None


def write_identity_file(path: str, identity: str) -> bool:
    """Root-only; True when it changed."""
    text = identity_file_text(identity)
    try:
        info = os.lstat(path)
        with open(path, encoding="utf-8", errors="replace") as handle:
            same = handle.read(4096) == text and stat.S_IMODE(info.st_mode) == 0o600
    except OSError:
        same = False
    if same:
        return False
    atomic_write(path, text, 0o600)
    return True


def rewrite_supervisor_state(path: str, identity: str, check: bool) -> bool:
    """The supervisor's state names its server's identity: earlier kits wrote the unkeyed hash
    there, world-readable. Put the keyed identity in its place, root-only; True when changed.
    A supervisor started by an earlier kit keeps its own copy in memory and writes it again
    when its server next exits; it then starts that server without an identity, and the next
    run restarts it under the new supervisor, which writes only keyed values."""
    state = read_json(path)
    if not isinstance(state, dict):
        return False
    try:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
    except OSError:
        return False
    if mode & 0o077 == 0 and state.get("config_hash") == identity:
        return False
    if not check:
        atomic_write(path, json.dumps({**state, "config_hash": identity}), 0o600)
    return True


class Wanted:
    """The wanted launch's identity and what server_service needs to know about it."""

    def __init__(self, identity: str | None, match: str, records_changed: bool):
        self.identity = identity
        self.match = match
        self.records_changed = records_changed


def wanted_identity(
    launch_text: str,
    running: str | None,
    key_file: str,
    identity_file: str,
    state_file: str | None,
    keep: bool,
    check: bool,
    hide=None,
) -> Wanted:
    """Compares the running server's identity with the wanted launch and writes the identity
    file (and, for a server that keeps running under the supervisor, its state) unless check.

    keep: a server runs (it is kept when it matches). hide(value) is told every secret value
    (the module's no_log list). In check mode without a key yet, the wanted identity is
    unknown: only a legacy hash can match."""
    argv, environment, found_secrets = parse_launch(launch_text)
    if hide is not None:
        for key, value in [*found_secrets.items(), *environment.items()]:
            secret = key in found_secrets or SECRET_KEY.search(key)
            if secret and isinstance(value, str) and value:
                hide(value)
    key = load_key(key_file, create=not check)
    identity = keyed_identity(key, argv, environment, found_secrets) if key else None
    found = match(running, identity, legacy_hash(argv, environment, found_secrets))
    if identity is None:
        return Wanted(None, found, True)
    if check:
        changed = read_identity_file(identity_file) != identity
    else:
        changed = write_identity_file(identity_file, identity)
    if keep and state_file and found in ("current", "legacy"):
        changed = rewrite_supervisor_state(state_file, identity, check) or changed
    return Wanted(identity, found, changed)
