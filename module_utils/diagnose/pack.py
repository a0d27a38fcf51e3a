"""The support bundle on the controller (module diagnose_bundle): the bundle's folder
prepared before any host is asked, then every host's fetched archive packed into one
tarball.

Each host's archive is outside input. Its members are read, never extracted: only regular
files with names of safe parts, within the host's caps, scrubbed again; everything lands
under `<run id>/<host>/` in one tarball (0600, whole or absent) with an index naming every
host, reached or not. The collection on the hosts is collect.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tarfile
import tempfile
import time

from ansible.module_utils.diagnose.members import (
    BUNDLE_KIND,
    COLLECTED,
    INDEX,
    MANIFEST,
    SCHEMA_VERSION,
    STALE_WORK_S,
    BadInput,
    add_member,
    clip,
    safe_part,
    unique,
    utc_now,
    valid_member,
)
from ansible.module_utils.host.archive import PartialArchive
from ansible.module_utils.host.secret_scrub import Scrubber

RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
STAGING_PREFIX = ".staging-"
# Members one host's archive may hold (the collection writes about 40).
HOST_MAX_MEMBERS = 1000
# The host's manifest: parsed for the index when it is at most this big.
MANIFEST_MAX = 8 << 20


def bundle_path(output_dir: str, run_id: str) -> str:
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise BadInput(
            f"run id {run_id!r}: needed letters, digits, '.', '_' or '-', starting with a "
            "letter or digit, at most 100. Fix: set diagnose_run_id so, or leave it empty for "
            "the time."
        )
    return os.path.join(output_dir, f"{run_id}.tar.gz")


def prepare_output(output_dir: str, run_id: str, check_mode: bool = False) -> dict:
    """The bundle's folder, made root-of-the-controller-user-only when new; a staging folder
    (0700) in it for the hosts' archives. Refuses a folder that cannot be written, or a bundle
    that exists, before any host is asked."""
    if not os.path.isabs(output_dir):
        raise BadInput(
            f"diagnose_output_dir {output_dir!r} is not absolute. Needed: an absolute folder "
            "on the controller. Fix: give a full path (the default is the checkout's "
            "diagnostics/)."
        )
    target = bundle_path(output_dir, run_id)
    if os.path.lexists(target):
        raise BadInput(
            f"{target} exists; a bundle is never replaced. Fix: another diagnose_run_id, or "
            "move the old bundle away."
        )
    if os.path.lexists(output_dir) and not os.path.isdir(output_dir):
        raise BadInput(
            f"diagnose_output_dir {output_dir} exists and is not a folder. Needed: a folder "
            "the controller user can write. Fix: set diagnose_output_dir to another path."
        )
    probe = output_dir
    while not os.path.isdir(probe):
        probe = os.path.dirname(probe)
    if not os.access(probe, os.W_OK | os.X_OK):
        raise BadInput(
            f"diagnose_output_dir {output_dir}: {probe} is not writable by this user "
            f"(uid {os.geteuid()}). Needed: a folder the controller user can write. Fix: "
            "change its permissions, or set diagnose_output_dir to a folder you own."
        )
    if check_mode:
        return {"output_dir": output_dir, "bundle": target, "staging_dir": None}
    try:
        os.makedirs(output_dir, mode=0o700, exist_ok=True)
        remove_stale_staging(output_dir)
        staging = tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{run_id}.", dir=output_dir)
    except OSError as error:
        raise BadInput(
            f"diagnose_output_dir {output_dir}: cannot write there "
            f"({error.strerror or error}). Needed: a folder the controller user can write, "
            "with room for the bundle. Fix: free space, fix its permissions, or set "
            "diagnose_output_dir elsewhere."
        ) from None
    return {"output_dir": output_dir, "bundle": target, "staging_dir": staging}


def remove_stale_staging(output_dir: str) -> None:
    with contextlib.suppress(OSError):
        for entry in os.scandir(output_dir):
            if entry.name.startswith(STAGING_PREFIX) and entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    if time.time() - entry.stat(follow_symlinks=False).st_mtime > STALE_WORK_S:
                        shutil.rmtree(entry.path, ignore_errors=True)


def read_host_archive(path: str, max_bytes: int, scrub: Scrubber) -> tuple[list, list, dict]:
    """(members as (name, bytes), what was left out with why, the host's manifest or {}) of
    one fetched host archive, read member by member and never extracted: only regular files
    with valid names, at most max_bytes in all."""
    members, left_out, manifest = [], [], {}
    try:
        size = os.lstat(path).st_size
    except OSError as error:
        return [], [("(archive)", f"not fetched: {error.strerror or error}")], {}
    if size > max_bytes:
        return [], [("(archive)", f"{size} bytes compressed, over the cap of {max_bytes}")], {}
    total = 0
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            count = 0
            while True:
                info = tar.next()
                if info is None:
                    break
                count += 1
                name = info.name
                shown = scrub(clip(name, 200))
                if count > HOST_MAX_MEMBERS:
                    left_out.append((shown, f"more than {HOST_MAX_MEMBERS} members: the rest"))
                    break
                if not info.isreg():
                    left_out.append((shown, "not a regular file (a link, folder or device)"))
                    continue
                if not valid_member(name) or scrub(name) != name:
                    left_out.append((shown, "not a member name the bundle writes"))
                    continue
                if total + info.size > max_bytes:
                    left_out.append((shown, f"past the host's cap of {max_bytes} bytes"))
                    # Stop before reading past it: the rest of a hostile archive is not read.
                    break
                handle = tar.extractfile(info)
                data = handle.read(info.size) if handle else b""
                total += len(data)
                data = scrub.bytes(data)
                if name == MANIFEST and len(data) <= MANIFEST_MAX:
                    with contextlib.suppress(ValueError, RecursionError):
                        loaded = json.loads(data)
                        manifest = loaded if isinstance(loaded, dict) else {}
                members.append((name, data))
    except (tarfile.TarError, OSError, EOFError, ValueError) as error:
        left_out.append(("(archive)", f"unreadable from there on: {clip(str(error), 300)}"))
    return members, left_out, manifest


def manifest_summary(manifest: dict) -> dict:
    """Counts per state and the items not collected, from a host's manifest (outside input:
    every field type-checked, strings clipped)."""
    items = manifest.get("items") if isinstance(manifest.get("items"), list) else []
    counts: dict[str, int] = {}
    problems = []
    for item in items[:HOST_MAX_MEMBERS]:
        if not isinstance(item, dict):
            continue
        status = str(item.get("status", "?"))[:32]
        counts[status] = counts.get(status, 0) + 1
        if status not in COLLECTED:
            problems.append(
                {
                    "name": clip(item.get("name", "?"), 200),
                    "status": status,
                    "source": clip(item.get("source", ""), 300),
                    "why": clip(item.get("why", ""), 500),
                }
            )
    return {"counts": counts, "problems": problems}


def build_bundle(
    output_dir: str,
    run_id: str,
    staging_dir: str,
    hosts: list[str],
    outcomes: dict,
    secrets: list[str],
    max_host_bytes: int,
) -> dict:
    """One tarball of every host's members under <run id>/<host>/ and <run id>/index.json,
    written next to its name and linked into place (whole or absent, never replacing a file),
    0600. The staging folder is removed whatever happens."""
    target = bundle_path(output_dir, run_id)
    scrub = Scrubber([s for s in secrets if isinstance(s, str) and s])
    staging = os.path.realpath(staging_dir) if staging_dir else ""
    try:
        partial = PartialArchive(output_dir, prefix=f".{run_id}.", suffix=".partial")
    except OSError as error:
        raise BadInput(
            f"diagnose_output_dir {output_dir}: the bundle cannot be written there "
            f"({error.strerror or error}). Fix: free space or fix its permissions, then run "
            "diagnose.yml again."
        ) from None
    try:
        with partial.tar() as tar:
            index_hosts, written = pack_hosts(
                tar, run_id, staging, hosts, outcomes, scrub, max_host_bytes
            )
            index = index_of(run_id, index_hosts, scrub)
            add_member(tar, f"{run_id}/{INDEX}", scrub.bytes(json.dumps(index, indent=1).encode()))
        try:
            partial.publish(target, 0o600)
        except FileExistsError:
            raise BadInput(f"{target} appeared while packing; it was left as it is") from None
    finally:
        partial.discard()
        if staging_dir:
            shutil.rmtree(staging_dir, ignore_errors=True)
    return {
        "bundle": target,
        "bytes": os.path.getsize(target),
        "member_bytes": written,
        "hosts": {
            h: {k: e[k] for k in ("state", "why", "counts") if k in e}
            for h, e in index_hosts.items()
        },
        # Not `unreachable` or `failed`: Ansible reads those keys of a result as its state.
        "unreachable_hosts": index["unreachable"],
        "failed_hosts": index["failed"],
    }


def pack_hosts(tar, run_id, staging, hosts, outcomes, scrub, max_host_bytes) -> tuple[dict, int]:
    """Every host's entry of the index, by its scrubbed name (made unique), with the members
    of a collected host's archive added under <run id>/<its folder>/; and the member bytes
    added."""
    index_hosts: dict[str, dict] = {}
    folders: set[str] = set()
    keys: set[str] = set()
    written = 0
    for name in map(str, hosts):
        host = outcomes.get(name) if isinstance(outcomes.get(name), dict) else {}
        if not host:
            host = {
                "state": "failed",
                "why": "no outcome recorded: the play stopped on this host before it",
            }
        folder = unique(safe_part(scrub(name)), folders)
        entry = {
            "folder": f"{run_id}/{folder}",
            "state": str(host.get("state", "failed")),
            "why": scrub(clip(host.get("why") or "")),
        }
        if entry["state"] == "collected":
            archive = host.get("archive") or ""
            written += pack_host(tar, entry, archive, staging, scrub, max_host_bytes)
        index_hosts[unique(scrub(name), keys)] = entry
    return index_hosts, written


def pack_host(tar, entry: dict, archive: str, staging: str, scrub, max_host_bytes: int) -> int:
    """The members of one collected host's archive, under the entry's folder, and what the
    entry says of them (counts, problems, what was left out); the member bytes added. An
    archive outside the staging folder is not read: the host counts as failed."""
    real = os.path.realpath(archive) if archive else ""
    if not staging or os.path.dirname(real) != staging:
        entry.update(state="failed", why="its archive is not in the staging folder")
        return 0
    # The host's cap leaves its manifest out of the count.
    members, left_out, manifest = read_host_archive(real, max_host_bytes + MANIFEST_MAX, scrub)
    written = 0
    for member_name, data in members:
        add_member(tar, f"{entry['folder']}/{member_name}", data)
        written += len(data)
    entry.update(manifest_summary(manifest))
    entry["members"] = len(members)
    if left_out:
        entry["left_out"] = [{"name": n, "why": w} for n, w in left_out]
    if not manifest:
        entry["why"] = entry["why"] or "no readable manifest.json"
    return written


def index_of(run_id: str, index_hosts: dict, scrub) -> dict:
    """The bundle's index.json: every host's entry, those unreachable and failed, and how many
    values the controller masked."""
    return {
        "kind": BUNDLE_KIND,
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "created_at": utc_now(),
        "hosts": index_hosts,
        "unreachable": sorted(h for h, e in index_hosts.items() if e["state"] == "unreachable"),
        "failed": sorted(h for h, e in index_hosts.items() if e["state"] == "failed"),
        "masked_on_controller": scrub.count,
    }
