"""Runs a custom module from library/ in-process, as Ansible would, and returns its result."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from pathlib import Path

from ansible.module_utils.testing import patch_module_args

REPO = Path(__file__).resolve().parents[2]


def load_module(name: str):
    spec = importlib.util.spec_from_file_location(
        f"library_{name}", REPO / "library" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_module(name: str, args: dict, check_mode: bool = False) -> dict:
    """The module's JSON result; `failed` is set when it called fail_json."""
    module = load_module(name)
    if check_mode:
        args = {**args, "_ansible_check_mode": True}
    stdout = io.StringIO()
    with (
        patch_module_args(args),
        contextlib.redirect_stdout(stdout),
        contextlib.suppress(SystemExit),
    ):
        module.main()
    return json.loads(stdout.getvalue())


def assert_unchanged(result: dict) -> None:
    """A second run of a module: it succeeded first (a module that failed early changed nothing
    too), then it changed nothing."""
    assert not result.get("failed"), f"the module failed: {result.get('msg')}"
    assert result.get("changed") is False, f"it reported a change: {result}"
