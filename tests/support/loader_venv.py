"""The CPU-only venv in which tests/unit/test_canary_loaders.py runs compressed-tensors' own
decompressor over the tiny canary checkpoints.

Built on first use (about 70 s on a cold machine, most of it installing torch; under a second
once built) and stamped on its inputs in tests/.state/loader-venv/.inputs.json, as the
contract venv is (tests/contract/contract_venv.py, whose helpers this uses rather than copies):

- compressed-tensors and transformers at the versions sglang's own wheel requires, and
  pydantic and psutil as it lists them: its METADATA's Requires-Dist, read at build time from
  the release the kit pins (kimi_sglang_version in group_vars/all/model.yml). For 0.5.23 that
  is compressed-tensors==0.18.0 and transformers==5.19.0, what the real server loads with.
- torch: the contract venv's CPU build (contract_venv.TORCH, 2.13.0+cpu, which pip takes
  from this machine's disk); the decompressor is plain tensor arithmetic on CPU.
- loguru, compressed-tensors' own requirement, and safetensors, to read the checkpoint as
  torch tensors; every distribution the locks also pin at the locks' version (constraints).

`python -m tests.support.loader_venv` builds it by hand and prints how long it took.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.contract import contract_venv as cv

REPO = cv.REPO
VENV = REPO / "tests" / ".state" / "loader-venv"
STAMP = VENV / ".inputs.json"
INSTALLED = VENV / ".installed.txt"
LOCK = REPO / "tests" / ".state" / ".loader-venv.lock"
PINS = REPO / "tests" / ".state" / "loader-venv-lock-pins.txt"
# Taken from sglang's Requires-Dist with the specifier it gives them.
FROM_SGLANG = ("compressed-tensors", "transformers", "pydantic", "psutil")
ALSO = ("loguru", "safetensors")
SMOKE = "import compressed_tensors, safetensors.torch, torch, transformers"
# The sglang wheel is cp311 manylinux_2_34: its tags, so that any controller Python can fetch
# it (only its METADATA is read; it is never installed).
SGLANG_TAGS = [
    "--python-version",
    "3.11",
    "--implementation",
    "cp",
    "--abi",
    "cp311",
    "--platform",
    "manylinux_2_34_x86_64",
]


def inputs() -> dict:
    def sha(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    return {
        "sglang": cv.pinned_version(),
        "python": sys.version.split()[0],
        "script_sha256": sha(Path(__file__)),
        "helpers_sha256": sha(Path(cv.__file__)),
        "lock_sha256": hashlib.sha256(b"".join(p.read_bytes() for p in cv.LOCKS)).hexdigest(),
    }


def sglang_requirements(version: str, downloads: Path) -> list[str]:
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "download", "--quiet"]
    fetch = [*pip, "--no-deps", "--only-binary=:all:", *SGLANG_TAGS, "-d", str(downloads)]
    cv.run([*fetch, f"sglang=={version}"], cv.DOWNLOAD_TIMEOUT)
    wheels = sorted(downloads.glob("sglang-*.whl"))
    if len(wheels) != 1:
        sys.exit(f"expected one sglang wheel in {downloads}, found {[w.name for w in wheels]}")
    declared = cv.requires_dist(wheels[0])
    missing = [name for name in FROM_SGLANG if cv.normalize(name) not in declared]
    if missing:
        sys.exit(
            f"{wheels[0].name} no longer requires {missing}; review FROM_SGLANG in "
            f"{Path(__file__).relative_to(REPO)}"
        )
    return [declared[cv.normalize(name)] for name in FROM_SGLANG]


def build(wanted: dict) -> None:
    started = time.monotonic()
    shutil.rmtree(VENV, ignore_errors=True)
    # Without a pip of its own: the checkout's pip installs into it (--python), which spares
    # installing one (ensurepip) and is the pip the dev lock pins, twice as fast as the one a
    # Python 3.11 venv comes with.
    cv.run([sys.executable, "-m", "venv", "--without-pip", str(VENV)], cv.VENV_TIMEOUT)
    python = VENV / "bin" / "python"
    downloads = VENV / ".downloads"
    requirements = [*sglang_requirements(wanted["sglang"], downloads), cv.TORCH, *ALSO]
    print("loader venv requirements:", ", ".join(requirements), flush=True)
    constraints = ["--constraint", str(cv.lock_pins(PINS))]
    outer_pip = [sys.executable, "-m", "pip", "--python", str(python)]
    pip = [*outer_pip, "--disable-pip-version-check", "install", "--quiet"]
    # --no-compile: pip would compile every file of torch and transformers, thousands the
    # loaders never import; what they import is compiled (and cached) on first import.
    cv.run(
        [*pip, "--only-binary=:all:", "--no-compile", *constraints, *requirements],
        cv.INSTALL_TIMEOUT,
    )
    shutil.rmtree(downloads)
    lines = cv.check_cpu_only(python, outer_pip)
    smoke = subprocess.run(
        [str(python), "-c", SMOKE], capture_output=True, text=True, timeout=cv.CHECK_TIMEOUT
    )
    if smoke.returncode != 0:
        sys.exit(f"the loader venv does not import its loaders:\n{smoke.stderr[-2000:]}")
    INSTALLED.write_text("\n".join(lines) + "\n")
    STAMP.write_text(json.dumps(wanted, indent=1, sort_keys=True) + "\n")
    print(
        f"loader venv built in {time.monotonic() - started:.0f} s: {len(lines)} distributions, "
        f"{cv.folder_bytes(VENV) / 1e6:.0f} MB in {VENV.relative_to(REPO)}",
        flush=True,
    )


def ensure() -> tuple[Path, dict]:
    """The venv's python, built when missing or stale, and how long getting it took."""
    started = time.monotonic()
    wanted = inputs()
    python = VENV / "bin" / "python"
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    # pytest-xdist workers or another checkout's run: one builds, the others wait for it.
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = None
        if python.exists() and STAMP.is_file():
            with contextlib.suppress(ValueError):
                built = json.loads(STAMP.read_text())
        fresh = built != wanted
        if fresh:
            build(wanted)
    return python, {"built": fresh, "seconds": round(time.monotonic() - started, 1)}


if __name__ == "__main__":
    print(json.dumps(ensure()[1]))
