"""A stand-in `sglang` distribution whose `python -m sglang.launch_server` is the simulator.

The runtime role installs it from a wheelhouse exactly as it installs the real release, and the
server role runs it exactly as it runs the real server: the package carries
tests/support/sglang_sim.py, the argv validator and the pinned parser's snapshot, so it refuses
what sglang 0.5.23 refuses.
It also ships sglang's parser entry point, `sglang.srt.server_args` (ServerArgs.add_cli_args,
prepare_server_args) and `sglang.srt.speculative.spec_info.SpeculativeAlgorithm`, built from the
same contract, so the deploy's launch check (module_utils/server/launch_check.py) runs against it as
against the real package.
Its requirements are pinned like the real wheel's (PyYAML, which `--config` needs, packaging,
Jinja2), so the runtime role's pin and `pip check` assertions have something to check.

build_wheel() makes the wheel; build_git_source() makes a git repository laid out like SGLang's
(the package under python/) with a pull-request ref, for the git runtime. The pull-request commit
adds DDTree's contract overlay (tests/contract/sglang-pr29907-overlay.json), so that runtime
accepts and simulates DDTree and its parser behaves like the pull request's base (validation at
construction, no resolve_once), while main and the wheel behave like 0.5.23.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VERSION = "0.5.23"
# Jinja2 as the real wheel brings it (through its tokenizer stack): the benchmark renders
# prompts through the chat template with the runtime's Python.
REQUIRES = [
    "PyYAML==6.0.4",
    "packaging==26.4",
    "Jinja2==3.1.6",
    "MarkupSafe==3.0.4",
    'pytest>=8; extra == "test"',
]
LAUNCH = "import sys\n\nfrom sglang.simulator import main\n\nsys.exit(main())\n"


# sglang.srt.server_args as the test runtimes ship it: the parser of the contract in the package.
SERVER_ARGS = '''"""Stand-in for sglang.srt.server_args (tests/support/fake_sglang.py): the parser
and the launch rules of the contract this package ships, the release's snapshot, plus DDTree's
overlay on the fake pull-request ref. Like sglang 0.5.23, the release flavour builds its
record without checking it (ServerArgs.resolve_once checks); like the pull request's base, the
DDTree flavour checks when the record is built (from_cli_args) and has no resolve_once."""

import argparse
from pathlib import Path
from types import SimpleNamespace

from sglang import sglang_args as _contract

_HERE = Path(__file__).resolve().parent.parent
_OVERLAY = _HERE / "sglang-pr29907-overlay.json"
CONTRACT = _contract.load_contract(
    _HERE / "sglang-0.5.23-args.json", _OVERLAY if _OVERLAY.is_file() else None
)
LAZY = not _OVERLAY.is_file()


class ServerArgs(SimpleNamespace):
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        _contract.add_arguments(parser, CONTRACT)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace):
        record = cls(**vars(args))
        if not LAZY:
            record._resolve()
        return record

    def _resolve(self) -> None:
        values = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        errors = _contract.launch_rule_errors(
            values,
            CONTRACT.get("launch_rules"),
            label=_contract.contract_label(CONTRACT),
            algorithms=_contract.contract_algorithms(CONTRACT),
        )
        if errors:
            raise ValueError(str(errors[0]))
        for key, value in _contract.resolve_forced(values, CONTRACT).items():
            setattr(self, key, value)


if LAZY:
    ServerArgs.resolve_once = ServerArgs._resolve


def prepare_server_args(argv):
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    if "--config" in argv:
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

        argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
    return ServerArgs.from_cli_args(parser.parse_args(argv))
'''

CONFIG_MERGER = '''"""Stand-in for sglang.srt.utils.server_args_config_parser: --config
FILE.yaml merged into argv before parsing, the command line winning (the simulator's
merge_config_file)."""


class ConfigArgumentMerger:
    def __init__(self, parser=None, boolean_actions=None):
        self.parser = parser

    def merge_config_with_args(self, argv):
        from sglang.simulator import merge_config_file

        return merge_config_file(list(argv))
'''

SPEC_INFO = '''"""Stand-in for sglang.srt.speculative.spec_info: the contract's algorithm names."""

from sglang.srt.server_args import CONTRACT


class SpeculativeAlgorithm:
    @staticmethod
    def from_string(name):
        names = CONTRACT.get("speculative_algorithms") or {}
        known = set(names.get("builtin", [])) | set(names.get("aliases", {}))
        if name is not None and str(name).upper() not in known:
            raise ValueError(f"Unknown speculative algorithm name: {name}")
        return None if name is None else str(name).upper()
'''


# The kit's stage packages the speed model imports, shipped under sglang/kit/ with the kit's
# module_utils/__init__.py, which makes them importable as ansible.module_utils.<stage>.
KIT_STAGES = ("contract", "plan")


def kit_files() -> dict[str, bytes]:
    files = {
        "sglang/kit/module_utils/__init__.py": (REPO / "module_utils/__init__.py").read_bytes()
    }
    for stage in KIT_STAGES:
        for path in sorted((REPO / "module_utils" / stage).glob("*.py")):
            files[f"sglang/kit/module_utils/{stage}/{path.name}"] = path.read_bytes()
    return files


def package_files(version: str, ddtree: bool = False) -> dict[str, bytes]:
    """The package's files; ddtree adds the pull request's overlay (the fake PR commit)."""
    files = {
        "sglang/__init__.py": f'__version__ = "{version}"\n'.encode(),
        "sglang/version.py": f'__version__ = "{version}"\n'.encode(),
        "sglang/launch_server.py": LAUNCH.encode(),
        "sglang/simulator.py": (REPO / "tests/support/sglang_sim.py").read_bytes(),
        # What `python -m sglang.check_env` prints, from the test host's own tools.
        "sglang/check_env.py": (REPO / "tests/support/sim_check_env.py").read_bytes(),
        # The argv validator: sglang_args.py and the launch rules it imports from beside it.
        "sglang/sglang_args.py": (REPO / "module_utils/plan/sglang_args.py").read_bytes(),
        "sglang/sglang_launch_rules.py": (
            REPO / "module_utils/plan/sglang_launch_rules.py"
        ).read_bytes(),
        # The simulator's step times under SGLANG_SIM_SPEED_MODEL: the kit's speed model (with
        # the capacity code it reads parameter groups from, under kit/) and the hardware figures.
        **kit_files(),
        "sglang/speed_hardware.json": (REPO / "group_vars/all/speed_hardware.json").read_bytes(),
        "sglang/sglang-0.5.23-args.json": (
            REPO / "tests/contract/sglang-0.5.23-args.json"
        ).read_bytes(),
        "sglang/srt/__init__.py": b"",
        "sglang/srt/server_args.py": SERVER_ARGS.encode(),
        "sglang/srt/utils/__init__.py": b"",
        "sglang/srt/utils/server_args_config_parser.py": CONFIG_MERGER.encode(),
        "sglang/srt/speculative/__init__.py": b"",
        "sglang/srt/speculative/spec_info.py": SPEC_INFO.encode(),
    }
    if ddtree:
        files["sglang/sglang-pr29907-overlay.json"] = (
            REPO / "tests/contract/sglang-pr29907-overlay.json"
        ).read_bytes()
    return files


def write_package(folder: Path, version: str = VERSION, ddtree: bool = False) -> Path:
    """The package's files under folder (for PYTHONPATH): the release, or with ddtree the fake
    pull request's runtime, without installing either."""
    for name, data in package_files(version, ddtree).items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return folder


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(folder: Path, version: str = VERSION, requires: list[str] | None = None) -> Path:
    return wheel(folder, "sglang", version, package_files(version), requires or REQUIRES)


def wheel(folder: Path, name: str, version: str, files: dict[str, bytes], requires: list[str]):
    """A pure-Python wheel with the given files and Requires-Dist lines."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    metadata = "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
        name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)
    )
    files = dict(files)
    files[f"{info}/METADATA"] = metadata.encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: kimi-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = [record_line(n, data) for n, data in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for n, data in sorted(files.items()):
            # Fixed timestamps: the same inputs give the same wheel, byte for byte.
            archive.writestr(zipfile.ZipInfo(n, (2026, 1, 1, 0, 0, 0)), data)
    return path


def git(folder: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "tests",
        "GIT_AUTHOR_EMAIL": "tests@example.invalid",
        "GIT_COMMITTER_NAME": "tests",
        "GIT_COMMITTER_EMAIL": "tests@example.invalid",
        "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
        "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        ["git", "-C", str(folder), *args], check=True, capture_output=True, text=True, env=env
    )
    return done.stdout.strip()


def build_git_source(folder: Path, pr_ref: str = "refs/pull/29907/head") -> dict:
    """A bare repository with `main` and a pull-request ref one commit ahead of it."""
    work = folder / "work"
    bare = folder / "sglang.git"
    work.mkdir(parents=True)
    git(work, "init", "-q", "-b", "main")
    version = f"{VERSION}.dev1"
    for name, data in package_files(version).items():
        path = work / "python" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (work / "python" / "pyproject.toml").write_text(
        "[build-system]\n"
        'requires = ["setuptools"]\n'
        'build-backend = "setuptools.build_meta"\n\n'
        "[project]\n"
        f'name = "sglang"\nversion = "{version}"\n'
        # Jinja2 as the release's: the simulator renders chat completions through the served
        # folder's chat template (the canary's tiny checkpoints ship the real one).
        f"dependencies = {REQUIRES[:4]!r}\n".replace("'", '"')
        + "\n"
        "[tool.setuptools.package-data]\n"
        'sglang = ["*.json"]\n'
    )
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "release")
    main = git(work, "rev-parse", "HEAD")
    (work / "python" / "sglang" / "ddtree.py").write_text("BUDGETS = (16, 32, 64, 128)\n")
    for name, data in package_files(version, ddtree=True).items():
        path = work / "python" / name
        if not path.exists():
            path.write_bytes(data)
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "DDTree")
    pr = git(work, "rev-parse", "HEAD")
    git(work, "update-ref", pr_ref, pr)
    git(work, "reset", "-q", "--hard", main)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    git(bare, "update-ref", pr_ref, pr)
    return {"url": f"file://{bare}", "ref": pr_ref, "commit": pr, "main": main}


PATCH = """\
--- a/python/sglang/ddtree.py
+++ b/python/sglang/ddtree.py
@@ -1 +1,2 @@
 BUDGETS = (16, 32, 64, 128)
+PATCHED = True
"""
