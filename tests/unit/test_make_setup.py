"""`make setup` on a controller without the package index: a wheelhouse (PIP_FIND_LINKS,
PIP_NO_INDEX) installs the locks with their hashes checked and says what it did; an install
that fails removes the venv it left half-built and names the fix. The Makefile runs in a
folder of its own with a one-package lock, from the Python running the tests. Without PYTHON,
make builds from the distribution's Python where it can make a supported venv, else python3."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WHEEL = "kimi_setup_probe-1.0-py3-none-any.whl"


def build_wheel(folder: Path) -> str:
    """A one-module wheel written by hand (no build backend, no index); its sha256."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "kimi_setup_probe.py": "VALUE = 42\n",
        "kimi_setup_probe-1.0.dist-info/METADATA": (
            "Metadata-Version: 2.1\nName: kimi-setup-probe\nVersion: 1.0\n"
        ),
        "kimi_setup_probe-1.0.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    record.append("kimi_setup_probe-1.0.dist-info/RECORD,,")
    files["kimi_setup_probe-1.0.dist-info/RECORD"] = "\n".join(record) + "\n"
    with zipfile.ZipFile(folder / WHEEL, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return hashlib.sha256((folder / WHEEL).read_bytes()).hexdigest()


def make_setup(kit: Path, wheelhouse: Path) -> subprocess.CompletedProcess:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "MAKE"))},
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheelhouse),
    }
    return subprocess.run(
        [
            "make",
            "--no-print-directory",
            "setup",
            "LOCKS=requirements.lock",
            f"PYTHON={sys.executable}",
        ],
        cwd=kit,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_wheelhouse_installs_the_lock_offline_and_a_failed_install_leaves_no_venv(tmp_path):
    kit, wheelhouse = tmp_path / "kit", tmp_path / "wheelhouse"
    kit.mkdir()
    shutil.copy(REPO / "Makefile", kit)
    digest = build_wheel(wheelhouse)
    lock = kit / "requirements.lock"

    # A hash the wheel does not have: pip refuses it, and the half-built venv goes.
    lock.write_text(f"kimi-setup-probe==1.0 \\\n    --hash=sha256:{'0' * 64}\n")
    failed = make_setup(kit, wheelhouse)
    assert failed.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in failed.stderr
    assert "removed the half-built .venv" in failed.stderr
    assert not (kit / ".venv").exists()

    # The right hash, from the wheelhouse alone.
    lock.write_text(f"kimi-setup-probe==1.0 \\\n    --hash=sha256:{digest}\n")
    built = make_setup(kit, wheelhouse)
    assert built.returncode == 0, built.stderr
    assert "make setup: .venv holds the 1 packages of requirements.lock, hashes checked, in " in (
        built.stdout
    )
    probe = subprocess.run(
        [str(kit / ".venv/bin/python"), "-c", "import kimi_setup_probe as p; print(p.VALUE)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.strip() == "42", probe.stderr
    again = make_setup(kit, wheelhouse)
    assert again.returncode == 0
    assert again.stdout.strip() == "make setup: .venv is up to date with requirements.lock"


def chosen_python(tmp_path: Path, system_python: str, *variables: str) -> str:
    """The Python `make setup` would build the venv from, without PYTHON in the environment."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHON" and not k.startswith("MAKE")}
    shutil.copy(REPO / "Makefile", tmp_path)
    database = subprocess.run(
        ["make", "-n", "-p", "help", f"SYSTEM_PYTHON={system_python}", *variables],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    # A variable from the command line prints as "PYTHON = ...", one the Makefile set as ":=".
    found = re.search(r"^PYTHON :?= (.*)$", database, re.MULTILINE)
    assert found, database[-2000:]
    return found.group(1)


def test_the_distributions_python_is_chosen_only_where_it_can_make_a_supported_venv(tmp_path):
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert chosen_python(tmp_path, sys.executable) == sys.executable
    # Its version not one ansible-core supports, no venv module, or none at all: python3.
    others = " ".join(v for v in ("3.11", "3.12", "3.13", "3.14") if v != here)
    assert chosen_python(tmp_path, sys.executable, f"CONTROLLER_PYTHONS={others}") == "python3"
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "ensurepip.py").write_text("raise ImportError('ensurepip is not available')\n")
    without_venv = tmp_path / "python3-without-venv"
    without_venv.write_text(f'#!/bin/sh\nPYTHONPATH={stub} exec {sys.executable} "$@"\n')
    without_venv.chmod(0o755)
    assert chosen_python(tmp_path, str(without_venv)) == "python3"
    assert chosen_python(tmp_path, str(tmp_path / "no-such-python")) == "python3"
    # Not Linux (SYSTEM_PYTHON empty): python3, without running anything.
    assert chosen_python(tmp_path, "") == "python3"
    # PYTHON given on the command line wins.
    assert chosen_python(tmp_path, sys.executable, "PYTHON=python3.12") == "python3.12"
