"""Whether a venv already holds every pin of a requirements file, read from its metadata.

ansible.builtin.pip with a requirements file runs pip three times on every run (a freeze, the
install, a freeze to see whether anything changed): several seconds of CPU on a host whose venv
already holds the pins. This reads the venv's own record instead (pyvenv.cfg and the METADATA
of each installed distribution, bounded), so the install runs only where a pin is missing or
differs, the venv belongs to another Python, or anything cannot be read: any doubt says "not
satisfied" and pip decides, as it did before. Runs on the hosts: the standard library and the
runtime stage's PEP 503 name rule.
"""

from __future__ import annotations

import glob
import os
import re

from ansible.module_utils.runtime.freeze import canonical_name

# name==version, as the kit's requirement files pin each package (a comment or blank is
# skipped; any other line is something only pip can judge).
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")
MAX_DISTRIBUTIONS = 2000
MAX_METADATA_HEAD = 16384
MAX_REQUIREMENTS_BYTES = 1 << 20


def parse_pins(text: str) -> dict[str, str] | None:
    """{canonical name: version} of a requirements text, or None when a line is not a plain
    pin (an option, a URL, a range, a marker): then only pip can say what it wants."""
    if not isinstance(text, str) or len(text) > MAX_REQUIREMENTS_BYTES:
        return None
    pins = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _PIN.fullmatch(line)
        if match is None:
            return None
        pins[canonical_name(match.group(1))] = match.group(2)
    return pins


def _header(path: str, field: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            head = handle.read(MAX_METADATA_HEAD).decode("utf-8", errors="replace")
    except OSError:
        return None
    for line in head.splitlines():
        if not line.strip():
            break  # the headers end at the first blank line
        key, _, value = line.partition(":")
        if key.strip().lower() == field:
            return value.strip()
    return None


def venv_python_version(venv: str) -> str | None:
    """major.minor of the Python the venv was made with (its pyvenv.cfg), or None."""
    try:
        with open(os.path.join(venv, "pyvenv.cfg"), encoding="utf-8", errors="replace") as handle:
            text = handle.read(MAX_METADATA_HEAD)
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("version", "version_info"):
            match = re.match(r"\s*(\d+)\.(\d+)", value)
            if match:
                return f"{match.group(1)}.{match.group(2)}"
    return None


def installed(venv: str, python_version: str) -> dict[str, str] | None:
    """{canonical name: version} of what the venv's site-packages holds, or None if unreadable."""
    site = os.path.join(venv, "lib", f"python{python_version}", "site-packages")
    if not os.path.isdir(site):
        return None
    found = {}
    for info in sorted(glob.glob(os.path.join(glob.escape(site), "*.dist-info")))[
        :MAX_DISTRIBUTIONS
    ]:
        metadata = os.path.join(info, "METADATA")
        name, version = _header(metadata, "name"), _header(metadata, "version")
        if name and version:
            found[canonical_name(name)] = version
    return found


def satisfied(venv: str, python_version: str, requirements: str) -> tuple[bool, str]:
    """(whether the venv made by a Python of python_version holds every pin, why not)."""
    pins = parse_pins(requirements)
    if pins is None:
        return False, "the requirements are not plain name==version pins"
    if not os.access(os.path.join(venv, "bin", "python"), os.X_OK):
        return False, f"{venv} has no Python"
    made_with = venv_python_version(venv)
    if made_with != python_version:
        return False, f"{venv} was made by Python {made_with}, not {python_version}"
    have = installed(venv, python_version)
    if have is None:
        return False, f"{venv} has no readable site-packages"
    wrong = [
        f"{name}=={version} (found {have.get(name) or 'none'})"
        for name, version in sorted(pins.items())
        if have.get(name) != version
    ]
    if wrong:
        return False, "not installed: " + ", ".join(wrong[:20])
    return True, ""
