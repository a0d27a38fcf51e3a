"""The study lock (kimi.lock.yml) against a run: what the hosts ask for, resolving it, recording
what a run used and freezing runtime sets. The logic of library/study_lock.py; it runs on the
controller. The file itself (its checks, reading it and replacing it under a flock) is
study_lock_file.py, which says what the lock is for.
"""

from __future__ import annotations

import contextlib
import os

from ansible.module_utils.plan.study_lock_file import (
    REPO_ID,
    RUNTIME_KINDS,
    SHA,
    UPDATE_FIX,
    LockError,
    check_no_credentials,
    check_runtime,
    checked_mapping,
    checked_text,
    empty_lock,
    load,
    lock_content,
    locked_folder,
    shown,
    utc_now,
    write,
)

# -- what a run asks for ---------------------------------------------------------------------


def merge_requested(requests: list) -> dict:
    """One {weights: {repo: revision}, datasets: {repo: revision}, git: {name: {url, ref}}}
    from every host's request; two hosts asking one repository at two revisions is an error."""
    merged: dict = {"weights": {}, "datasets": {}, "git": {}}
    for request in requests or []:
        request = checked_mapping(request, "a host's request")
        for section in ("weights", "datasets"):
            for repo, revision in checked_mapping(request.get(section), section).items():
                repo = checked_text(repo, f"{section} repository", REPO_ID)
                revision = checked_text(revision, f"{section}.{repo} revision")
                if merged[section].setdefault(repo, revision) != revision:
                    raise LockError(
                        f"two hosts of this run ask {repo} at different revisions "
                        f"({merged[section][repo]} and {revision}); one study pins one"
                    )
        for name, source in checked_mapping(request.get("git"), "git").items():
            source = checked_mapping(source, f"git.{name}")
            wanted = {
                "url": checked_text(source.get("url"), f"git.{name}.url"),
                "ref": checked_text(source.get("ref"), f"git.{name}.ref"),
            }
            check_no_credentials(wanted["url"], f"kimi_sglang_git ({name})")
            if merged["git"].setdefault(name, wanted) != wanted:
                raise LockError(f"two hosts of this run ask different git sources for {name}")
    return merged


def merge_known(found: list, conflicts: list | None = None) -> dict:
    """One {weights: {repo: commit}, datasets: {repo: commit}, git: {name: commit}} from what
    every host resolved; the first host's commit stands (the lock holds one), and a host that
    resolved another one (a branch moved during the run) is added to `conflicts`."""
    merged: dict = {"weights": {}, "datasets": {}, "git": {}}
    for index, item in enumerate(found or []):
        item = checked_mapping(item, "what a host resolved")
        for section in merged:
            for name, commit in checked_mapping(item.get(section), section).items():
                if not isinstance(name, str) or not isinstance(commit, str):
                    continue
                if not SHA.fullmatch(commit):
                    continue
                kept = merged[section].setdefault(name, commit)
                if kept != commit and conflicts is not None:
                    conflicts.append(
                        f"{section} {name}: host {index + 1} of the run used {commit}, an earlier "
                        f"one {kept} (it moved during the run); the lock keeps {kept}"
                    )
    return merged


def mismatches(lock: dict, requested: dict) -> list[str]:
    """Entries the lock holds for other settings than this run's, each as a sentence."""
    found = []
    for section, setting in (("weights", "revision"), ("datasets", "revision")):
        for repo, revision in requested.get(section, {}).items():
            entry = lock[section].get(repo)
            if entry and revision not in (entry["requested"], entry["revision"]):
                found.append(
                    f"{section} {repo}: the lock was made from {entry['requested']} (commit "
                    f"{entry['revision']}), this run asks {setting} {revision}"
                )
    for name, source in requested.get("git", {}).items():
        entry = lock["git"].get(name)
        if not entry:
            continue
        if entry["url"] != source["url"]:
            found.append(
                f"git {name}: the lock has url {entry['url']}, this run asks {source['url']}"
            )
        elif source["ref"] not in (entry["ref"], entry["commit"]):
            found.append(
                f"git {name}: the lock was made from ref {entry['ref']} (commit "
                f"{entry['commit']}), this run asks {source['ref']}"
            )
    return found


def pins(lock: dict | None, requested: dict) -> dict:
    """The commits this run uses: the lock's, for what the run asks and the lock holds."""
    found: dict = {"weights": {}, "datasets": {}, "git": {}}
    if lock is None:
        return found
    for section in ("weights", "datasets"):
        for repo, revision in requested.get(section, {}).items():
            entry = lock[section].get(repo)
            if entry and revision in (entry["requested"], entry["revision"]):
                found[section][repo] = entry["revision"]
    for name, source in requested.get("git", {}).items():
        entry = lock["git"].get(name)
        if (
            entry
            and entry["url"] == source["url"]
            and source["ref"] in (entry["ref"], entry["commit"])
        ):
            found["git"][name] = {key: entry[key] for key in ("url", "ref", "commit")}
    return found


def missing(lock: dict | None, requested: dict) -> list[str]:
    """What the run asks that the lock does not pin yet, as `section name` strings."""
    lock = lock or empty_lock()
    return [
        f"{section} {name}"
        for section in ("weights", "datasets", "git")
        for name in requested.get(section, {})
        if name not in lock[section]
    ]


def mismatch_error(path: str, found: list[str]) -> LockError:
    return LockError(
        f"{path} does not fit this run's settings: " + "; ".join(found) + ". Needed: the "
        "settings the lock was made from, or a lock made from these. Fix: put the settings "
        "back, or run `ansible-playbook plan.yml -i <your inventory>`, which locks what "
        f"changed (or `{UPDATE_FIX}` to resolve everything anew)"
    )


# -- resolving and recording -----------------------------------------------------------------


def resolved_entries(
    lock: dict,
    requested: dict,
    known: dict,
    resolvers: dict,
    update: bool,
    now: str,
    unresolved: list | None = None,
) -> tuple[dict, list[dict]]:
    """A new lock with every requested entry pinned: kept where the lock has it for the same
    setting (unless `update`), taken from `known` (commits the caller already resolved, e.g.
    hub_repo_info's answers: {weights: {repo: sha}}), else resolved with resolvers[section]
    (callable(name, requested) -> commit). Returns the lock and what changed. With a list
    as `unresolved`, an entry that cannot be resolved is left out and its message added there
    (plan.yml says so and goes on); without, the LockError ends the call."""
    new = {key: (dict(value) if isinstance(value, dict) else value) for key, value in lock.items()}
    changes: list[dict] = []
    for section in ("weights", "datasets"):
        for repo, revision in requested.get(section, {}).items():
            entry = lock[section].get(repo)
            if entry and not update and revision in (entry["requested"], entry["revision"]):
                continue
            # A commit asked for is its own answer: pinning by SHA needs no hub.
            commit = revision if SHA.fullmatch(revision) else None
            commit = (
                commit
                or (known.get(section) or {}).get(repo)
                or _commit_of(f"{section} {repo}", unresolved, resolvers[section], repo, revision)
            )
            if commit is None:
                continue
            commit = checked_text(commit, f"the commit {repo}@{revision} resolved to", SHA)
            if entry and entry["revision"] == commit and entry["requested"] == revision:
                continue
            new[section][repo] = {"requested": revision, "revision": commit, "resolved_at": now}
            changes.append(
                {
                    "entry": f"{section} {repo}",
                    "requested": revision,
                    "was": entry["revision"] if entry else None,
                    "now": commit,
                }
            )
    for name, source in requested.get("git", {}).items():
        change = _git_entry_change(
            lock, new, name, source, known, resolvers, update, now, unresolved
        )
        if change:
            changes.append(change)
    return new, changes


def _git_entry_change(
    lock: dict,
    new: dict,
    name: str,
    source: dict,
    known: dict,
    resolvers: dict,
    update: bool,
    now: str,
    unresolved: list | None,
) -> dict | None:
    """resolved_entries() for one git source: pinned into `new` unless the lock holds it for
    the same URL and ref (or its commit); the change, or None where nothing changed."""
    entry = lock["git"].get(name)
    same_source = entry and entry["url"] == source["url"]
    if same_source and not update and source["ref"] in (entry["ref"], entry["commit"]):
        return None
    commit = source["ref"] if SHA.fullmatch(source["ref"]) else None
    commit = (
        commit
        or (known.get("git") or {}).get(name)
        or _commit_of(f"git {name}", unresolved, resolvers["git"], source["url"], source["ref"])
    )
    if commit is None:
        return None
    commit = checked_text(commit, f"the commit {source['ref']} of {source['url']} resolved to", SHA)
    if same_source and entry["commit"] == commit and entry["ref"] == source["ref"]:
        return None
    new["git"][name] = {**source, "commit": commit, "resolved_at": now}
    return {
        "entry": f"git {name}",
        "requested": source["ref"],
        "was": entry["commit"] if entry else None,
        "now": commit,
    }


def _commit_of(entry: str, unresolved: list | None, resolve, *args) -> str | None:
    """resolve(*args); with a list as `unresolved`, a LockError adds the entry's message there
    and gives None instead of ending the call, but for HubUnreachable, which always ends it."""
    try:
        return resolve(*args)
    except HubUnreachable:
        # Not one entry's problem: a lock resolved without the hub would pin nothing of it.
        raise
    except LockError as error:
        if unresolved is None:
            raise
        unresolved.append(f"{entry}: {error}")
        return None


def change_lines(changes: list[dict]) -> list[str]:
    return [
        f"{c['entry']}: {c['requested']} -> {c['now']}"
        + (f" (was {c['was']})" if c["was"] and c["was"] != c["now"] else "")
        for c in changes
    ]


def sync(
    path: str,
    requested: dict,
    *,
    known: dict | None = None,
    resolvers: dict | None = None,
    mode: str = "read",
    update: bool = False,
    check_mode: bool = False,
    tolerate_mismatch: bool = False,
    runtime_built_from: dict | None = None,
) -> dict:
    """The lock against this run's settings.

    mode `read`: no resolving; a mismatch fails; returns the pins.
    mode `record`: adds what the run used (`known`) where the lock has nothing yet; a mismatch
        fails (the run followed other settings than the lock's).
    mode `resolve` (plan.yml): entries missing or made from other settings are resolved
        (`known` first, then the resolvers); with `update` every entry, and the frozen runtime
        sets are dropped (the next deploy freezes them anew); so is a frozen set whose source
        moved (the git commit relocked, or `runtime_built_from` naming another release).
    `tolerate_mismatch` (a plan without the hub): entries that do not fit are not pinned and
    are named in `unresolved` instead of failing."""
    resolvers = resolvers or {}
    known = known or {}
    unresolved: list[str] = []
    with locked_folder(path) if not check_mode and mode != "read" else contextlib.nullcontext():
        current = load(path)
        lock = current or empty_lock()
        if mode in ("read", "record"):
            found = mismatches(lock, requested)
            if found and not tolerate_mismatch:
                raise mismatch_error(path, found)
            unresolved += [f"{line} (plan.yml with the hub locks it)" for line in found]
        if mode == "read":
            return _answer(path, current, requested, False, [], unresolved)
        if mode == "record":
            wanted = {
                section: {
                    name: value for name, value in values.items() if name not in lock[section]
                }
                for section, values in requested.items()
            }
            wanted = {
                section: {
                    name: value
                    for name, value in values.items()
                    if name in (known.get(section) or {})
                }
                for section, values in wanted.items()
            }
            new, changes = resolved_entries(lock, wanted, known, {}, False, utc_now())
        else:
            new, changes = resolved_entries(
                lock, requested, known, resolvers, update, utc_now(), unresolved
            )
            stale = _stale_runtimes(new, changes, runtime_built_from or {}, update)
            for kind in stale:
                del new["runtime"][kind]
                changes.append(
                    {
                        "entry": f"runtime {kind}",
                        "requested": "dropped",
                        "was": None,
                        "now": "dropped",
                    }
                )
        # A record with nothing new writes nothing, not even an empty first lock.
        written = (current is None and (mode == "resolve" or bool(changes))) or (
            current is not None and lock_content(new) != lock_content(current)
        )
        if written and not check_mode:
            write(path, new)
        return _answer(path, new, requested, written, changes, unresolved)


def _stale_runtimes(lock: dict, changes: list, built_from: dict, update: bool) -> list[str]:
    """Frozen sets that no longer fit: all on update; the git one when its commit was relocked;
    one whose built_from differs from what the settings build now."""
    stale = []
    for kind, entry in lock["runtime"].items():
        relocked = kind == "git" and any(c["entry"] == "git sglang" for c in changes)
        wanted = built_from.get(kind)
        moved = isinstance(wanted, dict) and any(
            entry["built_from"].get(key) != value for key, value in wanted.items()
        )
        if update or relocked or moved:
            stale.append(kind)
    return stale


def _answer(
    path: str, lock: dict | None, requested: dict, written: bool, changes: list, unresolved: list
) -> dict:
    return {
        "unresolved": unresolved,
        "path": path,
        "exists": lock is not None,
        "written": written,
        "lock": lock or {},
        "pins": pins(lock, requested),
        "missing": missing(lock, requested),
        "changes": changes,
        "messages": change_lines(changes),
    }


def record_runtime(
    path: str, kind: str, record: dict, replace: bool = False, check_mode: bool = False
) -> dict:
    """Freezes a runtime set into the lock when it holds none for `kind` (or, with replace,
    one built from another source). Returns {recorded, runtime, path}."""
    if kind not in RUNTIME_KINDS:
        raise LockError(f"kind is {shown(kind)}; needed one of {', '.join(RUNTIME_KINDS)}")
    entry = check_runtime({**record, "recorded_at": utc_now()}, f"the {kind} runtime record")
    with locked_folder(path) if not check_mode else contextlib.nullcontext():
        current = load(path)
        lock = current or empty_lock()
        held = lock["runtime"].get(kind)
        if held and not (replace and held["built_from"] != entry["built_from"]):
            return {"recorded": False, "runtime": held, "path": path}
        lock["runtime"][kind] = entry
        if not check_mode:
            write(path, lock)
        return {"recorded": True, "runtime": entry, "path": path}


# -- resolvers (the controller's network) ------------------------------------------------------


def ls_remote_commit(output: str, url: str, ref: str) -> str:
    """The commit `git ls-remote URL REF` names for ref: an exact ref first, then the branch
    or tag it abbreviates; an annotated tag's peeled commit (`^{}`) wins over the tag object."""
    found: dict[str, str] = {}
    for line in output.splitlines()[:10000]:
        parts = line.split("\t")
        if len(parts) == 2 and SHA.fullmatch(parts[0]):
            found[parts[1]] = parts[0]
    for name in (ref, f"refs/heads/{ref}", f"refs/tags/{ref}"):
        if f"{name}^{{}}" in found:
            return found[f"{name}^{{}}"]
        if name in found:
            return found[name]
    if not found:
        raise LockError(
            f"git ref {ref} was not found at {url}. Needed: an existing branch, tag, pull-request "
            "ref (refs/pull/N/head) or commit. Fix kimi_sglang_git.ref"
        )
    raise LockError(f"git ref {ref} at {url} is ambiguous: {', '.join(sorted(found)[:5])}")


def git_resolver(run, timeout_s: float):
    """resolver(url, ref) -> commit through `git ls-remote`, under a deadline; `run` is
    host_helpers.run_with_deadline's signature."""

    def resolve(url: str, ref: str) -> str:
        if SHA.fullmatch(ref):
            return ref
        if url.lstrip().startswith("-") or ref.lstrip().startswith("-"):
            raise LockError(f"git url {url!r} or ref {ref!r} begins with '-'")
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
        rc, out, err = run(
            ["git", "ls-remote", "--", url, ref],
            timeout_s,
            env=env,
            what=f"study_lock's git timeout ({timeout_s:.0f} s)",
            max_output_bytes=16 << 20,
        )
        if rc != 0:
            raise LockError(f"`git ls-remote {url} {ref}` failed: {err.strip()[:400]}")
        return ls_remote_commit(out, url, ref)

    return resolve


class HubUnreachable(LockError):
    """The hub did not answer: nothing can be resolved, and nothing is written."""


def hub_resolver(kind: str, endpoint: str, token: str, request_timeout: float, deadline_s: float):
    """resolver(repo, revision) -> commit of a hub `model` or `dataset` repository, through
    huggingface_hub with module_utils/weights/hub.py's bounds (request timeout, deadline,
    retries)."""
    from ansible.module_utils.weights import hub

    if not hub.HAS_HUB:
        raise LockError("huggingface_hub is not installed in the controller's Python (make setup)")
    hub.use_request_timeout(request_timeout)
    api = hub.HfApi(endpoint=endpoint)
    deadline = hub.Deadline(deadline_s)
    info_of = api.dataset_info if kind == "dataset" else api.model_info

    def resolve(repo: str, revision: str) -> str:
        if SHA.fullmatch(revision):
            return revision
        try:
            info = hub.call_hub(
                lambda timeout: info_of(
                    repo, revision=revision, token=token or False, timeout=timeout
                ),
                deadline,
                request_timeout,
            )
        except Exception as error:
            verdict, message = hub.classify(error, repo, revision, endpoint, bool(token))
            if verdict == "unreachable":
                raise HubUnreachable(f"{kind} {message}") from None
            raise LockError(f"{kind} {message}") from None
        return checked_text(
            getattr(info, "sha", None), f"the hub's commit for {repo}@{revision}", SHA
        )

    return resolve
