"""venv_pins (module_utils/host/venv_pins.py, library/venv_pins.py): pip runs only where a
venv lacks a pin; any doubt leaves the decision to pip."""

from __future__ import annotations

import sys

from ansible.module_utils.host import venv_pins

from tests.support.modules import run_module

HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"
PINS = "# the tools\nhuggingface_hub==2.4.0\nPyYAML==6.0.4  # a comment\n\n"


def fake_venv(root, version=HERE, packages=(("huggingface-hub", "2.4.0"), ("pyyaml", "6.0.4"))):
    """A venv's record as venv and pip leave it: pyvenv.cfg, bin/python, dist-info METADATA."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").write_text("#!/bin/sh\n")
    (root / "bin" / "python").chmod(0o755)
    (root / "pyvenv.cfg").write_text(f"home = /usr/bin\nversion = {version}.2\n")
    site = root / "lib" / f"python{version}" / "site-packages"
    site.mkdir(parents=True)
    for name, version_ in packages:
        info = site / f"{name.replace('-', '_')}-{version_}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version_}\n\nName: not-a-header\n"
        )
    return root


def test_a_venv_with_every_pin_is_satisfied_and_any_doubt_is_not(tmp_path):
    venv = fake_venv(tmp_path / "ok")
    assert venv_pins.satisfied(str(venv), HERE, PINS) == (True, "")
    older = fake_venv(tmp_path / "older", packages=(("huggingface_hub", "2.3.0"),))
    ok, why = venv_pins.satisfied(str(older), HERE, PINS)
    assert (
        not ok
        and "huggingface-hub==2.4.0 (found 2.3.0)" in why
        and "pyyaml==6.0.4 (found none)" in why
    )
    other = fake_venv(tmp_path / "other", version="3.9")
    assert venv_pins.satisfied(str(other), HERE, PINS) == (
        False,
        f"{other} was made by Python 3.9, not {HERE}",
    )
    assert not venv_pins.satisfied(str(tmp_path / "absent"), HERE, PINS)[0]
    for text in ("huggingface_hub>=2\n", "--index-url http://x\n", "a==1 ; python_version<'3'\n"):
        assert venv_pins.satisfied(str(venv), HERE, text) == (
            False,
            "the requirements are not plain name==version pins",
        )
    (venv / "bin" / "python").unlink()
    assert venv_pins.satisfied(str(venv), HERE, PINS) == (False, f"{venv} has no Python")


def test_the_module_checks_the_python_and_reads_the_venv(tmp_path):
    venv = fake_venv(tmp_path / "venv")
    args = {"python": sys.executable, "venv": str(venv), "requirements": PINS}
    result = run_module("venv_pins", args)
    assert result["can_create"] and result["python_version"] == HERE and result["satisfied"]
    assert result["changed"] is False
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'No module named ensurepip' >&2\nexit 1\n")
    broken.chmod(0o755)
    result = run_module("venv_pins", {**args, "python": str(broken)})
    assert not result["can_create"] and not result["satisfied"]
    assert "No module named ensurepip" in result["error"]
    hung = tmp_path / "hung"
    hung.write_text("#!/bin/sh\nsleep 30\n")
    hung.chmod(0o755)
    result = run_module("venv_pins", {**args, "python": str(hung), "timeout": 0.5})
    assert not result["can_create"] and "did not finish within 0.5s" in result["error"]
    assert run_module("venv_pins", {**args, "timeout": 0})["failed"]
