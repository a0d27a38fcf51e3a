"""The frozen runtime (issue 20 part 2): what the study lock records of a runtime venv and how a
later deploy installs exactly that set again.

- pip's `--report` JSON (written by every pip install the runtime role runs) merged into the
  host's hash record (`<kind>-hashes.json`: name -> {version: sha256}), so that a later run
  which installs nothing still knows the hashes of what an earlier one installed;
- the lock record's package set (sha256 where the record has one for that version);
- the frozen requirements text a deploy from the lock installs (`--require-hashes` only when
  every package has a hash);
- the package-by-package drift between an installed set and the lock's, and its one-line report;
- the driver and its CUDA version from `nvidia-smi -q`.

Everything read here comes from outside (pip's report, the record on the host, the lock file,
nvidia-smi): sizes are bounded, types checked, and names, versions and hashes must match strict
patterns before they reach a requirements file (a name such as `--index-url=...` would be an
option there). Standard library only: modules ship it to hosts.
"""

from __future__ import annotations

import json
import re

from ansible.module_utils.contract.level import NOT_FROZEN

# PEP 503 normalisation; names and versions as PEP 508/440 spell them (bounded).
_SEPARATORS = re.compile(r"[-_.]+")
# fullmatch, never `$`: `$` matches before a final newline, which would split a requirement line.
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9])?")
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]{0,63}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_NVIDIA_LINE = re.compile(r"^\s*(driver version|cuda version)\s*:\s*(\S.*?)\s*$", re.IGNORECASE)

# A pip report of a full SGLang install (torch, CUDA wheels) is a few MB.
MAX_REPORT_BYTES = 32 << 20
MAX_RECORD_BYTES = 8 << 20
MAX_PACKAGES = 5000
MAX_NVIDIA_SMI_CHARS = 4 << 20


class FreezeError(ValueError):
    """Input that cannot be trusted or used; the message names what and why."""


def canonical_name(name: str) -> str:
    """PEP 503: lower case, runs of `-_.` as one `-`."""
    return _SEPARATORS.sub("-", name).lower()


def valid_name(name) -> bool:
    return isinstance(name, str) and bool(_NAME.fullmatch(name))


def valid_version(version) -> bool:
    return isinstance(version, str) and bool(_VERSION.fullmatch(version))


def valid_sha256(digest) -> bool:
    return isinstance(digest, str) and bool(_SHA256.fullmatch(digest))


def _report_sha256(download_info) -> str | None:
    """The archive's sha256 in a report item: `archive_info.hashes.sha256` (pip 23.1 and
    later) or the older `archive_info.hash` (`sha256=<hex>`, pip 23.0 still writes only it)."""
    if not isinstance(download_info, dict):
        return None
    archive = download_info.get("archive_info")
    if not isinstance(archive, dict):
        return None
    hashes = archive.get("hashes")
    if isinstance(hashes, dict) and valid_sha256(hashes.get("sha256")):
        return hashes["sha256"]
    legacy = archive.get("hash")
    if isinstance(legacy, str) and legacy.startswith("sha256="):
        digest = legacy[len("sha256=") :]
        if valid_sha256(digest):
            return digest
    return None


def report_hashes(report) -> dict[str, dict[str, str]]:
    """name -> {version: sha256} of every item pip installed with an archive hash. Items that
    are not well formed are skipped (a local directory install such as SGLang from git has
    none); a report that is not pip's shape at all raises FreezeError."""
    if not isinstance(report, dict) or not isinstance(report.get("install"), list):
        raise FreezeError("not a pip installation report (no `install` list)")
    if len(report["install"]) > MAX_PACKAGES:
        raise FreezeError(f"more than {MAX_PACKAGES} installed items")
    found: dict[str, dict[str, str]] = {}
    for item in report["install"]:
        if not isinstance(item, dict) or not isinstance(item.get("metadata"), dict):
            continue
        name, version = item["metadata"].get("name"), item["metadata"].get("version")
        digest = _report_sha256(item.get("download_info"))
        if valid_name(name) and valid_version(version) and digest:
            found.setdefault(canonical_name(name), {})[version] = digest
    return found


def parse_report(text: str | bytes) -> dict[str, dict[str, str]]:
    """report_hashes() of a report's text, bounded."""
    if len(text) > MAX_REPORT_BYTES:
        raise FreezeError(f"larger than {MAX_REPORT_BYTES} bytes")
    try:
        report = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise FreezeError(f"not JSON ({exc})") from None
    return report_hashes(report)


def clean_hash_record(record) -> dict[str, dict[str, str]]:
    """The well-formed part of a hash record (anything else read from the host is dropped)."""
    if not isinstance(record, dict):
        return {}
    clean: dict[str, dict[str, str]] = {}
    for name, versions in list(record.items())[:MAX_PACKAGES]:
        if not valid_name(name) or not isinstance(versions, dict):
            continue
        kept = {v: d for v, d in versions.items() if valid_version(v) and valid_sha256(d)}
        if kept:
            clean[canonical_name(name)] = kept
    return clean


def merge_hashes(record, found: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """The record with what a report found; a version's hash seen again replaces the old one
    (the same version rebuilt into another wheel is what is installed now)."""
    merged = clean_hash_record(record)
    for name, versions in found.items():
        merged.setdefault(name, {}).update(versions)
    return {name: dict(sorted(versions.items())) for name, versions in sorted(merged.items())}


def lock_packages(
    installed: dict, hash_record, kind: str
) -> tuple[dict[str, dict[str, str | None]], str]:
    """The lock's `packages` (name -> {version, sha256 or None}) of an installed set
    (runtime_check's `packages`: name -> version) and the `hashes` state: complete, partial or
    none. pip's tooling is left out, and for the git kind sglang too (its commit pins it)."""
    if not isinstance(installed, dict):
        raise FreezeError("the installed package set is not a mapping of name to version")
    hashes = clean_hash_record(hash_record)
    left_out = set(NOT_FROZEN) | ({"sglang"} if kind == "git" else set())
    packages: dict[str, dict[str, str | None]] = {}
    for raw_name, version in installed.items():
        if not valid_name(raw_name) or not valid_version(version):
            raise FreezeError(f"installed package {raw_name!r} {version!r} is not name==version")
        name = canonical_name(raw_name)
        if name not in left_out:
            packages[name] = {"version": version, "sha256": hashes.get(name, {}).get(version)}
    return dict(sorted(packages.items())), hashes_state(packages)


def hashes_state(packages: dict) -> str:
    with_hash = sum(1 for entry in packages.values() if valid_sha256(entry.get("sha256")))
    if packages and with_hash == len(packages):
        return "complete"
    return "partial" if with_hash else "none"


def locked_set(packages) -> dict[str, dict[str, str | None]]:
    """The lock's `packages`, checked entry by entry: a name, a version, a sha256 or null."""
    if not isinstance(packages, dict) or not packages:
        raise FreezeError("the lock's packages is not a non-empty mapping")
    if len(packages) > MAX_PACKAGES:
        raise FreezeError(f"the lock lists more than {MAX_PACKAGES} packages")
    checked: dict[str, dict[str, str | None]] = {}
    for name, entry in packages.items():
        version = entry.get("version") if isinstance(entry, dict) else None
        digest = entry.get("sha256") if isinstance(entry, dict) else None
        if not valid_name(name) or not valid_version(version):
            raise FreezeError(f"the lock's package {name!r} has no valid name and version")
        if digest is not None and not valid_sha256(digest):
            raise FreezeError(f"the lock's package {name} has a sha256 that is not 64 hex digits")
        checked[canonical_name(name)] = {"version": version, "sha256": digest}
    return dict(sorted(checked.items()))


def frozen_requirements(packages, kind: str) -> tuple[str, bool]:
    """(requirements text, whether it carries hashes) of the lock's set: one
    `name==version --hash=sha256:<hex>` line each when every package has a hash (pip then
    refuses any archive that differs), else `name==version` lines. The git kind's sglang is
    built from its commit, never installed from here."""
    checked = locked_set(packages)
    if kind == "git":
        checked.pop("sglang", None)
    hashed = hashes_state(checked) == "complete"
    lines = [
        f"{name}=={entry['version']}" + (f" --hash=sha256:{entry['sha256']}" if hashed else "")
        for name, entry in checked.items()
    ]
    return "".join(line + "\n" for line in lines), hashed


def package_drift(installed, locked, ignore=NOT_FROZEN) -> list[dict[str, str | None]]:
    """[{name, locked, installed}] for every package whose installed version is not the
    locked one (None where absent), by name; `ignore` names packages neither side counts."""
    left_out = {canonical_name(name) for name in ignore}

    def versions(packages) -> dict[str, str]:
        if not isinstance(packages, dict):
            raise FreezeError("a package set is not a mapping")
        out = {}
        for name, value in packages.items():
            version = value.get("version") if isinstance(value, dict) else value
            if isinstance(name, str) and isinstance(version, str):
                out[canonical_name(name)] = version
        return {name: v for name, v in out.items() if name not in left_out}

    have, want = versions(installed), versions(locked)
    return [
        {"name": name, "locked": want.get(name), "installed": have.get(name)}
        for name in sorted(set(have) | set(want))
        if have.get(name) != want.get(name)
    ]


def drift_line(drift: list[dict]) -> str:
    """One line: `packaging: locked 26.4, installed 26.3; foo: not locked, installed 1.0`."""

    def side(word: str, version) -> str:
        return f"{word} {version}" if version is not None else f"not {word}"

    return "; ".join(
        f"{d['name']}: {side('locked', d['locked'])}, {side('installed', d['installed'])}"
        for d in drift
    )


def parse_nvidia_smi_query(text) -> dict[str, str | None]:
    """{driver, driver_cuda} from `nvidia-smi -q`'s plain text ("Driver Version : 580.65.06",
    "CUDA Version : 13.0"); None for what it does not say or says in a form not a version."""
    found: dict[str, str | None] = {"driver": None, "driver_cuda": None}
    if not isinstance(text, str):
        return found
    for line in text[:MAX_NVIDIA_SMI_CHARS].splitlines():
        match = _NVIDIA_LINE.match(line)
        if not match:
            continue
        key = "driver" if match.group(1).lower().startswith("driver") else "driver_cuda"
        value = match.group(2)
        if found[key] is None and re.fullmatch(r"[0-9]+(?:\.[0-9]+){0,3}", value):
            found[key] = value
    return found
