"""Build the contract venv: the pinned sglang and only what its argument parser imports.

`make test-contract` runs this with the system Python 3.11 (standard library only), then runs
tests/contract with the venv's python, so the cross-checks against the real parser run instead
of skipping. A full `pip install sglang` pulls about 4.7 GB of wheels (CUDA libraries, kernels,
tokenizers); the parser needs a small part of that.

What goes in:
- sglang itself, with --no-deps.
- The distributions the modules the contract tests import (`sglang.srt.server_args`,
  `sglang.srt.speculative.spec_info`, `sglang.srt.arg_groups.speculative_hook`) import when
  they load, listed in PARSER_IMPORTS, each with the specifier sglang's own wheel METADATA
  gives it (Requires-Dist), read at build time. Only torch is replaced (TORCH, below), and
  triton, which sglang imports but does not list, is added (EXTRA).
- The kit's test tools (pytest, ansible-core for `ansible.module_utils`, ansible-runner for
  tests/conftest.py) at the versions requirements.lock pins, which also constrains every shared
  dependency to the controller environment's versions.

The build is stamped on its inputs (the pin, this script, requirements.lock, the Python): a
second run with the same inputs does nothing, a changed input rebuilds the venv from scratch.
The venv must be CPU-only: the build fails if any NVIDIA/CUDA distribution got in or if torch
is a CUDA build.
"""

from __future__ import annotations

import email.parser
import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
VENV = REPO / "tests" / ".state" / "contract-venv"
STAMP = VENV / ".inputs.json"
INSTALLED = VENV / ".installed.txt"
LOCKS = (REPO / "requirements.lock", REPO / "requirements-dev.lock")
MODEL_VARS = REPO / "group_vars" / "all" / "model.yml"

# Distributions of sglang's Requires-Dist that the parser's import chain needs (found by
# importing with --no-deps and adding what failed, then confirmed by the import smoke test
# below). Most are imported at the top of python/sglang/srt/utils/common.py, which
# sglang.srt.utils.network (imported by server_args.py) pulls in; the package's own
# __init__ (python/sglang/__init__.py -> sglang.utils, sglang.lang.backend.runtime_endpoint)
# brings IPython, pydantic, tqdm and aiohttp. fastapi is there for starlette (imported by
# utils/common.py), which sglang gets only through fastapi.
PARSER_IMPORTS = [
    "aiohttp",
    "fastapi",
    "ipython",
    "msgspec",
    "numpy",
    "orjson",
    "packaging",
    "pillow",
    "psutil",
    "pybase64",
    "pydantic",
    "pyzmq",
    "requests",
    "torch",
    "tqdm",
]

# sglang pins torch==2.14.1, a CUDA build whose requirements bring ~3.6 GB of NVIDIA wheels.
# PyPI has no CPU-only build of torch for Linux; this one is the CPU build the machine's pip
# finds. The parser does not depend on it: sglang imports torch at module load (utils/common.py)
# for the runtime, while the option table comes from dataclass fields and fixed choice lists
# (python/sglang/srt/arg_groups/); the snapshot written with torch 2.14.1 and the full
# dependency closure was identical to this venv's but for the recorded torch version.
TORCH = "torch==2.13.0+cpu"
# The torch requirement TORCH and EXTRA were chosen for; a release that asks for another one
# stops the build until they are reviewed.
REPLACED_TORCH = "torch==2.14.1"

# Not in sglang's Requires-Dist, but imported at the top of python/sglang/srt/utils/common.py
# (sglang gets it through torch). torch 2.14.1, sglang's pin, requires triton~=3.8.0; the CPU
# torch build does not require triton at all, so pin the release sglang's torch would bring.
EXTRA = ["triton==3.8.0"]

# The kit's test tools; their versions, and those of anything they share with the above, come
# from requirements.lock (passed as constraints).
TEST_TOOLS = ["ansible-core", "ansible-runner", "pytest", "pytest-timeout", "PyYAML"]

# Modules the contract tests and snapshot_sglang_args.py import from sglang.
SMOKE_IMPORTS = [
    "sglang.srt.server_args",
    "sglang.srt.speculative.spec_info",
    "sglang.srt.speculative.spec_registry",
    "sglang.srt.arg_groups.speculative_hook",
]

# Distributions that mark a CUDA install (torch's CUDA build pulls these in).
CUDA_PREFIXES = ("nvidia-", "cuda-")

VENV_TIMEOUT = 300
DOWNLOAD_TIMEOUT = 1800
INSTALL_TIMEOUT = 1200
CHECK_TIMEOUT = 300


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned_version() -> str:
    """kimi_sglang_version from group_vars/all/model.yml (no YAML library in the system Python)."""
    found = re.findall(
        r'^kimi_sglang_version:\s*"?([0-9][0-9A-Za-z.+-]*)"?\s*$',
        MODEL_VARS.read_text(),
        flags=re.MULTILINE,
    )
    if len(found) != 1:
        sys.exit(f"expected one kimi_sglang_version in {MODEL_VARS.relative_to(REPO)}")
    return found[0]


def inputs() -> dict:
    return {
        "sglang": pinned_version(),
        "python": sys.version.split()[0],
        "script_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        "lock_sha256": hashlib.sha256(b"".join(p.read_bytes() for p in LOCKS)).hexdigest(),
    }


def run(cmd: list[str], timeout: int, **kwargs) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, timeout=timeout, **kwargs)


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def requires_dist(wheel: Path) -> dict[str, str]:
    """{normalized name: requirement line} for the wheel's unconditional Requires-Dist."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        if len(names) != 1:
            sys.exit(f"{wheel.name}: expected one .dist-info/METADATA, found {names}")
        metadata = email.parser.Parser().parsestr(archive.read(names[0]).decode("utf-8"))
    found: dict[str, str] = {}
    for line in metadata.get_all("Requires-Dist") or []:
        requirement, _, marker = line.partition(";")
        if "extra" in marker:
            continue  # optional extras (diffusion, runai, ...) are not installed by default
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
        if match is None:
            sys.exit(f"{wheel.name}: cannot read Requires-Dist {line!r}")
        found[normalize(match.group(1))] = line.strip()
    return found


def parser_requirements(wheel: Path) -> list[str]:
    declared = requires_dist(wheel)
    wanted = []
    for name in PARSER_IMPORTS:
        line = declared.get(normalize(name))
        if line is None:
            sys.exit(
                f"{wheel.name} no longer requires {name}; review PARSER_IMPORTS in "
                f"{Path(__file__).relative_to(REPO)} for this release"
            )
        if normalize(name) == "torch":
            if line.replace(" ", "") != REPLACED_TORCH:
                sys.exit(
                    f"{wheel.name} requires {line}, not {REPLACED_TORCH}: review TORCH, "
                    f"REPLACED_TORCH and EXTRA in {Path(__file__).relative_to(REPO)}"
                )
            print(f"  {line}  ->  {TORCH} (CPU build; see TORCH in this script)")
            continue
        print(f"  {line}")
        wanted.append(line)
    for line in EXTRA:
        print(f"  {line} (not in sglang's Requires-Dist; see EXTRA in this script)")
    return [*wanted, TORCH, *EXTRA]


def check_cpu_only(python: Path, pip: list[str] | None = None) -> list[str]:
    """The installed distributions, after refusing any CUDA wheel or CUDA torch build. `pip`:
    the pip that lists them, for a venv without a pip of its own."""
    pip = pip or [str(python), "-m", "pip"]
    listing = run(
        [*pip, "list", "--format=json", "--disable-pip-version-check"],
        CHECK_TIMEOUT,
        capture_output=True,
        text=True,
    )
    installed = json.loads(listing.stdout)
    if not isinstance(installed, list):
        sys.exit("pip list did not return a list")
    lines = sorted(f"{item['name']}=={item['version']}" for item in installed)
    cuda = [line for line in lines if normalize(line).startswith(CUDA_PREFIXES)]
    if cuda:
        sys.exit(f"the contract venv must be CPU-only, but it has {cuda}")
    probe = run(
        [str(python), "-c", "import torch; print(torch.version.cuda)"],
        CHECK_TIMEOUT,
        capture_output=True,
        text=True,
    )
    if probe.stdout.strip() != "None":
        sys.exit(f"torch in the contract venv is a CUDA build ({probe.stdout.strip()})")
    return lines


def check_dependencies(python: Path) -> None:
    """pip check, except sglang's own requirements, which are left out on purpose."""
    result = subprocess.run(
        [str(python), "-m", "pip", "check", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT,
        check=False,
    )
    problems = [
        line
        for line in result.stdout.splitlines()
        if line.strip() and not line.startswith("sglang ") and "No broken" not in line
    ]
    if problems:
        sys.exit("broken requirements in the contract venv:\n" + "\n".join(problems))


def check_imports(python: Path, version: str) -> None:
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    result = subprocess.run(
        [str(python), "-c", code, *SMOKE_IMPORTS],
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT,
        check=False,
    )
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        sys.exit(
            f"sglang {version}'s parser does not import in the contract venv:\n{tail}\n"
            f"If a module is missing, add its distribution to PARSER_IMPORTS in "
            f"{Path(__file__).relative_to(REPO)}."
        )


def lock_pins(path: Path) -> Path:
    """The locks' pins without their hashes, written to path, for pip --constraint: pip reads
    a hashed constraint as --require-hashes for the whole install, and what a venv adds to
    the locks (the parser's own requirements, the loaders) has no hashes there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(
            line.rstrip(" \\") + "\n"
            for lock in LOCKS
            for line in lock.read_text().splitlines()
            if line[:1].isalnum()
        )
    )
    return path


def build(wanted: dict) -> None:
    version = wanted["sglang"]
    started = time.monotonic()
    shutil.rmtree(VENV, ignore_errors=True)
    run([sys.executable, "-m", "venv", str(VENV)], VENV_TIMEOUT)
    python = VENV / "bin" / "python"
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    downloads = VENV / ".downloads"

    fetch = [*pip, "download", "--quiet", "--only-binary=:all:", "-d", str(downloads)]
    run([*fetch, "--no-deps", f"sglang=={version}"], DOWNLOAD_TIMEOUT)
    wheels = sorted(downloads.glob("sglang-*.whl"))
    if len(wheels) != 1:
        sys.exit(f"expected one sglang wheel in {downloads}, found {[w.name for w in wheels]}")
    print(f"requirements from {wheels[0].name}:")
    requirements = parser_requirements(wheels[0]) + TEST_TOOLS

    constraints = ["--constraint", str(lock_pins(VENV.parent / "lock-pins.txt"))]
    run([*fetch, *constraints, *requirements], DOWNLOAD_TIMEOUT)
    download_bytes = folder_bytes(downloads)
    local = ["--no-index", "--find-links", str(downloads)]
    run([*pip, "install", "--quiet", *local, *constraints, *requirements], INSTALL_TIMEOUT)
    # Last, so pip does not list every requirement of sglang's left out on purpose.
    run([*pip, "install", "--quiet", *local, "--no-deps", str(wheels[0])], INSTALL_TIMEOUT)
    shutil.rmtree(downloads)

    lines = check_cpu_only(python)
    check_dependencies(python)
    check_imports(python, version)
    INSTALLED.write_text("\n".join(lines) + "\n")
    STAMP.write_text(json.dumps(wanted, indent=1, sort_keys=True) + "\n")
    print(
        f"contract venv built in {time.monotonic() - started:.0f} s: {len(lines)} distributions, "
        f"{download_bytes / 1e6:.0f} MB downloaded (removed after install), "
        f"{folder_bytes(VENV) / 1e6:.0f} MB installed in {VENV.relative_to(REPO)}"
    )


def main() -> int:
    if sys.version_info[:2] != (3, 11):
        sys.exit(
            "The contract venv needs Python 3.11 (the sglang wheel is cp311); found "
            f"{sys.version.split()[0]}. Set PYTHON=/path/to/python3.11."
        )
    wanted = inputs()
    python = VENV / "bin" / "python"
    if python.exists() and STAMP.is_file():
        try:
            built = json.loads(STAMP.read_text())
        except ValueError:
            built = None
        if built == wanted:
            where = VENV.relative_to(REPO)
            print(f"contract venv is up to date (sglang {wanted['sglang']}): {where}")
            return 0
    build(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
