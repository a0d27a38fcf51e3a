"""Packaging for AWX and ansible-navigator: the execution environment, the license, the
collection-shaped copy that ansible-test checks (tests/integration/test_sanity.py runs it)."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.sanity import collection

REPO = Path(__file__).resolve().parents[2]
EE_FILE = REPO / "execution-environment.yml"
LOCK = REPO / "requirements.lock"
# ansible-builder create only copies files and renders a template: seconds at most.
BUILDER_TIMEOUT = 120


def pins(text: str) -> dict[str, frozenset[str]]:
    """A pip requirements file as {requirement: its hashes}: continuation lines joined, comments
    and indentation dropped, so the lock and ansible-builder's rewrite of it compare."""
    found: dict[str, frozenset[str]] = {}
    logical = ""
    for raw in [*text.splitlines(), ""]:
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            logical += " " + line[:-1].strip()
            continue
        logical = (logical + " " + line).strip()
        if logical:
            head, *options = logical.split(" --")
            assert all(option.startswith("hash=sha256:") for option in options), logical
            found[" ".join(head.split())] = frozenset(option.strip() for option in options)
        logical = ""
    return found


def pinned_version(text: str, name: str) -> str:
    match = re.search(rf"^{re.escape(name)}==([^\s;\\]+)", text, re.MULTILINE)
    assert match, f"no {name}== pin"
    return match.group(1)


def test_pins_reads_continuations_and_drops_comments():
    text = (
        "a==1 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n    # via x\n"
        "b==2 ; m \\\n--hash=sha256:cc\n"
    )
    assert pins(text) == {
        "a==1": frozenset({"hash=sha256:aa", "hash=sha256:bb"}),
        "b==2 ; m": frozenset({"hash=sha256:cc"}),
    }


def test_license_is_the_apache_text_the_roles_and_modules_declare():
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text.splitlines()[1] and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    metas = sorted(REPO.glob("roles/*/meta/main.yml"))
    assert metas
    for meta in metas:
        info = yaml.safe_load(meta.read_text(encoding="utf-8"))["galaxy_info"]
        assert info["license"] == "Apache-2.0", meta
    for module in sorted((REPO / "library").glob("*.py")):
        head = module.read_text(encoding="utf-8").splitlines()[:5]
        assert "# SPDX-License-Identifier: Apache-2.0" in head, module


def test_execution_environment_pins_what_the_locks_hold():
    definition = yaml.safe_load(EE_FILE.read_text(encoding="utf-8"))
    assert definition["version"] == 3
    deps = definition["dependencies"]
    assert deps["python"] == "requirements.lock"
    assert "galaxy" not in deps, "the kit uses no collection"
    # No unhashed install of ansible-core or ansible-runner: both come from the lock.
    assert "ansible_core" not in deps and "ansible_runner" not in deps
    lock = LOCK.read_text(encoding="utf-8")
    assert pinned_version(lock, "ansible-core") == pinned_version(
        (REPO / "requirements.in").read_text(), "ansible-core"
    )
    pinned_version(lock, "ansible-runner")
    pinned_version(lock, "dumb-init")
    options = definition["options"]
    assert options["skip_pip_install"] is True and options["skip_ansible_check"] is True
    assert options["container_init"]["package_pip"] == ""
    python = deps["python_interpreter"]["python_path"]
    version = re.fullmatch(r"/usr/bin/python(3\.\d+)", python)
    assert version and version.group(1) in ("3.11", "3.12", "3.13"), python


def ansible_builder() -> str:
    # conftest puts this venv's bin first on PATH, so `make setup`'s ansible-builder wins.
    found = shutil.which("ansible-builder")
    if found is None:
        pytest.fail(
            "ansible-builder is not installed: it is in requirements-dev.lock, run make setup"
        )
    return found


def test_ansible_builder_create_makes_a_context_that_installs_the_lock(tmp_path):
    context = tmp_path / "context"
    create = [ansible_builder(), "create", "-f", str(EE_FILE), "-c", str(context)]
    subprocess.run(
        [*create, "--output-filename", "Containerfile"],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=BUILDER_TIMEOUT,
    )
    containerfile = (context / "Containerfile").read_text(encoding="utf-8")
    definition = yaml.safe_load(EE_FILE.read_text(encoding="utf-8"))
    deps = definition["dependencies"]
    # Hardening II (4): the image's stages install nothing but the hashed lock. The base stage
    # installed ansible-core and ansible-runner unhashed, and the final hashed install then
    # found their dependencies satisfied, unchecked. Only the builder stage, which the image
    # does not keep, installs ansible-builder's own tools.
    stages = re.split(r"^FROM ", containerfile, flags=re.MULTILINE)[1:]
    for stage in stages:
        name = stage.split()[2] if len(stage.split()) > 2 else stage.split()[0]
        installs = re.findall(
            r"^RUN .*pip install.*$|^RUN /output/scripts/pip_install.*$", stage, re.M
        )
        if name == "builder":
            assert installs == ["RUN $PYCMD -m pip install --no-cache-dir bindep pyyaml packaging"]
        else:
            assert installs == [], (name, installs)
    assert "$ANSIBLE_INSTALL_REFS" not in containerfile
    final = stages[-1]
    assert (
        final.index("install-from-bindep")
        < final.index("check_ansible")
        < final.index("RUN rm -rf /output\n")
    )
    base = definition["images"]["base_image"]["name"]
    assert f'ARG EE_BASE_IMAGE="{base}"' in containerfile
    assert f'ARG PYCMD="{deps["python_interpreter"]["python_path"]}"' in containerfile
    # No collections: no galaxy step.
    assert "ansible-galaxy" not in containerfile
    assert "COPY _build/requirements.txt requirements.txt" in containerfile
    carried = context / "_build" / "requirements.txt"
    assert carried.read_bytes() == LOCK.read_bytes()

    # The build runs the context's introspect.py over the carried file and pip-installs what it
    # writes; run it here too: every pin and every hash of the lock must come through.
    written = tmp_path / "requirements.txt"
    subprocess.run(
        [
            sys.executable,
            str(context / "_build" / "scripts" / "introspect.py"),
            "introspect",
            f"--user-pip={carried}",
            f"--write-bindep={tmp_path / 'bindep.txt'}",
            f"--write-pip={written}",
        ],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=BUILDER_TIMEOUT,
    )
    lock_pins = pins(LOCK.read_text(encoding="utf-8"))
    assert len(lock_pins) > 10 and all(lock_pins.values())
    assert pins(written.read_text(encoding="utf-8")) == lock_pins


# --- the collection-shaped copy ------------------------------------------------------------


def test_rewrite_imports_moves_only_the_kits_module_utils():
    source = (
        "from ansible.module_utils.basic import AnsibleModule  # noqa: E402\n"
        "from ansible.module_utils.host.helpers import (  # noqa: E402\n"
        "    from ansible.module_utils import weights\n"
        "from ansible.module_utils import runtime as rt  # noqa: E402\n"
    )
    assert collection.rewrite_imports(source, Path("x.py")) == (
        "from ansible.module_utils.basic import AnsibleModule  # noqa: E402\n"
        f"from {collection.PACKAGE}.module_utils.host.helpers import (  # noqa: E402\n"
        f"    from {collection.PACKAGE}.module_utils import weights\n"
        f"from {collection.PACKAGE}.module_utils import runtime as rt  # noqa: E402\n"
    )
    with pytest.raises(collection.LayoutError, match="mixes"):
        collection.rewrite_imports("from ansible.module_utils import weights, basic\n", Path("x"))


def test_rewrite_fragments_names_them_by_fqcn_and_refuses_unknown_ones():
    doc = "options: {}\nextends_documentation_fragment:\n  - kimi_server_manager\nauthor:\n  - a\n"
    assert collection.rewrite_fragments(doc) == doc.replace(
        "  - kimi_server_manager", f"  - {collection.FQCN}.kimi_server_manager"
    )
    with pytest.raises(collection.LayoutError, match="nowhere"):
        collection.rewrite_fragments("extends_documentation_fragment:\n  - nowhere\n")


def test_build_lays_out_every_module_with_no_import_left_on_the_kits_path(tmp_path):
    root = collection.build(tmp_path)
    assert root == tmp_path / "ansible_collections" / collection.NAMESPACE / collection.NAME
    galaxy = yaml.safe_load((root / "galaxy.yml").read_text(encoding="utf-8"))
    assert (galaxy["namespace"], galaxy["name"]) == (collection.NAMESPACE, collection.NAME)
    assert galaxy["license"] == ["Apache-2.0"]
    for kind, source in (("modules", "library"), ("module_utils", "module_utils")):
        names = sorted(
            path.relative_to(REPO / source).as_posix()
            for path in (REPO / source).rglob("*.py")
            if "__pycache__" not in path.parts and path != REPO / "module_utils" / "__init__.py"
        )
        copied = root / "plugins" / kind
        assert sorted(p.relative_to(copied).as_posix() for p in copied.rglob("*.py")) == names
    for path in (root / "plugins").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                for name in imported:
                    parts = name.split(".")
                    kit = parts[:2] == ["ansible", "module_utils"] and len(parts) > 2
                    assert not (kit and parts[2] in collection.KIT_UTILS), f"{path}: {name}"
    assert (root / "tests" / "sanity" / "ignore-2.19.txt").is_file()
    with pytest.raises(collection.LayoutError, match="already exists"):
        collection.build(tmp_path)


# --- ansible-test's validate-modules on that copy ----------------------------------------------

# ansible-test keeps its sanity venvs and its pip bootstrap script under ~/.ansible/test; a HOME
# of the tests' own, kept between runs, lets a later run reuse the venv (seconds, not tens).
ANSIBLE_TEST_HOME = REPO / "tests" / ".state" / "ansible-test-home"
# A first run makes a venv and installs validate-modules' five requirements from the index.
SANITY_TIMEOUT = 600
# This controller's Python: ansible-test runs the check with it, no container (--local).
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
ANSIBLE_TEST = str(Path(sys.executable).parent / "ansible-test")
SANITY = [ANSIBLE_TEST, "sanity", "--test", "validate-modules", "--local"]


def local_get_pip(home: Path) -> Path:
    """Puts tests/sanity/get_pip.py where ansible-test looks before downloading get-pip.py."""
    from types import SimpleNamespace

    from ansible_test._internal.python_requirements import get_venv_packages

    pip_version = get_venv_packages(SimpleNamespace(version=PYTHON))["pip"]
    cached = home / ".ansible" / "test" / "cache" / f"get_pip_{pip_version.replace('.', '_')}.py"
    cached.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(REPO / "tests" / "sanity" / "get_pip.py", cached)
    return cached


def validate_modules(root: Path) -> subprocess.CompletedProcess[str]:
    local_get_pip(ANSIBLE_TEST_HOME)
    return subprocess.run(
        [*SANITY, "--python", PYTHON, "--color", "no"],
        cwd=root,
        env={**os.environ, "HOME": str(ANSIBLE_TEST_HOME)},
        capture_output=True,
        text=True,
        timeout=SANITY_TIMEOUT,
        check=False,
    )


def test_ignore_file_gives_a_reason_on_every_line():
    lines = (REPO / "tests/sanity/validate-modules-ignore-2.19.txt").read_text().splitlines()
    assert lines
    for line in lines:
        entry, _, reason = line.partition(" # ")
        path, code = entry.split(" ")
        assert path.startswith("plugins/modules/") and code.startswith("validate-modules:"), line
        assert len(reason.split()) >= 5, f"no reason given: {line}"


def test_validate_modules_passes_on_the_collection_copy(tmp_path):
    root = collection.build(tmp_path)
    run = validate_modules(root)
    assert run.returncode == 0, run.stdout + run.stderr
    # It did check the modules: the copy with one finding put back fails, naming it.
    module = root / "plugins" / "modules" / "sglang_benchmark.py"
    text = module.read_text(encoding="utf-8")
    no_log = '"max_new_tokens": {"type": "int", "default": 512, "no_log": False},'
    assert no_log in text
    module.write_text(text.replace(no_log, no_log.replace(', "no_log": False', "")))
    run = validate_modules(root)
    assert run.returncode != 0
    assert (
        "sglang_benchmark.py:0:0: no-log-needed: Argument 'max_new_tokens'"
        in run.stdout + run.stderr
    )


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel, built here (no network, no build backend)."""
    import base64
    import hashlib
    import zipfile

    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": b"VALUE = 1\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: kit-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = (
        "".join(
            f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
            for n, d in files.items()
        )
        + f"{info}/RECORD,,\n"
    )
    with zipfile.ZipFile(path, "w") as archive:
        for n, d in {**files, f"{info}/RECORD": record.encode()}.items():
            archive.writestr(n, d)
    return path


def test_a_tampered_hash_fails_the_images_install(tmp_path):
    """The final stage's install (install-from-bindep: pip install -r the lock) in a Python
    where nothing was installed before it, as the image now has it: a zeroed hash fails it. The
    second half is the defect the base stage's unhashed install made: a package already there
    is 'satisfied' and its hash never checked."""
    import hashlib
    import venv

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = _wheel(wheels, "kimitamper", "1.0")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    target = tmp_path / "python"
    venv.create(target, with_pip=True)
    pip = [str(target / "bin" / "python"), "-m", "pip", "install", "--no-index", "--find-links"]
    pip += [str(wheels), "--disable-pip-version-check", "-r"]

    def install(hash_hex: str) -> subprocess.CompletedProcess:
        lock = tmp_path / "requirements.txt"
        lock.write_text(f"kimitamper==1.0 \\\n    --hash=sha256:{hash_hex}\n")
        return subprocess.run(
            [*pip, str(lock)], capture_output=True, text=True, timeout=BUILDER_TIMEOUT
        )

    tampered = install("0" * 64)
    assert tampered.returncode != 0 and "DO NOT MATCH THE HASHES" in tampered.stderr
    assert install(digest).returncode == 0
    # Installed before (as the base stage's unhashed pip install did): the tampered lock passes.
    assert install("0" * 64).returncode == 0
