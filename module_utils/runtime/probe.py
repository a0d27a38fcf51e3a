"""runtime_check's probe: an environment's installed packages against its package's requirements.

A program, run by library/runtime_check.py as
`<environment's python> -c <this file's source> PACKAGE IMPORT_NAME`, so that the metadata,
the environment markers and the packaging library are the environment's own. That Python has
no Ansible: at the top it imports only the standard library, and packaging (or pip's vendored
copy) inside check_requirements(). It prints one line, MARKER + JSON; the module reads it
back with module_utils/host/helpers.py marked_json().
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import sys
import time

MARKER = "KIMI-RUNTIME "


def canon(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def installed_versions() -> dict[str, str]:
    installed = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name:
            installed[canon(name)] = dist.version
    return installed


def check_requirements(requires: list[str], installed: dict[str, str]) -> list[dict]:
    """Each Requires-Dist line whose marker holds here (extras ignored), with what is installed
    and whether it satisfies the requirement (pre-releases allowed)."""
    try:
        from packaging.requirements import Requirement
        from packaging.version import InvalidVersion, Version
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
        from pip._vendor.packaging.version import InvalidVersion, Version
    records = []
    for line in requires:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        have = installed.get(canon(req.name))
        ok = have is not None
        if ok and req.specifier:
            try:
                ok = req.specifier.contains(Version(have), prereleases=True)
            except InvalidVersion:
                ok = False
        pinned = [s.version for s in req.specifier if s.operator in ("==", "===")]
        records.append(
            {
                "name": canon(req.name),
                "required": str(req.specifier) or "any",
                "installed": have,
                "ok": ok,
                "pinned": pinned[0] if pinned else None,
            }
        )
    return records


def report_line(record: dict) -> str:
    return MARKER + json.dumps(record)


def main(argv: list[str] | None = None) -> None:
    package, import_name = sys.argv[1:3] if argv is None else argv[:2]
    installed = installed_versions()
    out = {
        "python": sys.executable,
        "python_version": sys.version.split()[0],
        "packages": dict(sorted(installed.items())),
        "requirements": [],
    }
    try:
        out["version"] = md.version(package)
        requires = md.requires(package) or []
    except md.PackageNotFoundError:
        out["version"] = None
        requires = []
    out["requirements"] = check_requirements(requires, installed)
    start = time.monotonic()
    try:
        module = importlib.import_module(import_name)
        out["import_version"] = getattr(module, "__version__", None)
        out["import_error"] = None
    except BaseException as error:
        out["import_version"] = None
        out["import_error"] = f"{type(error).__name__}: {error}"
    out["import_seconds"] = round(time.monotonic() - start, 2)
    print(report_line(out))


if __name__ == "__main__":
    main()
