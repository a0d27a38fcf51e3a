"""Runs a custom module from library/ in-process, as Ansible would, and returns its result;
loads the kit's filter plugins for tests of them."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import time
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


def load_filters():
    """filter_plugins/kimi_filters.py as a module, to call its filters directly."""
    spec = importlib.util.spec_from_file_location(
        "kimi_filters", REPO / "filter_plugins" / "kimi_filters.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def add_filter_plugins() -> None:
    """The kit's filters known to Ansible's plugin loader, for templates a test renders."""
    from ansible.plugins.loader import add_all_plugin_dirs, init_plugin_loader

    init_plugin_loader()
    add_all_plugin_dirs(str(REPO / "filter_plugins"))


def run_module(name: str, args: dict, check_mode: bool = False) -> dict:
    """The module's JSON result; `failed` is set when it called fail_json."""
    module = load_module(name)
    # A module runs in a process of its own: no controller code loaded (once any test imports
    # some, ansible-core 2.19 sends module warnings to the controller's display instead of the
    # result) and no warnings yet from an earlier run.
    from ansible.module_utils import _internal
    from ansible.module_utils.common import warnings as ansible_warnings

    ansible_warnings._global_warnings.clear()
    ansible_warnings._global_deprecations.clear()
    if check_mode:
        args = {**args, "_ansible_check_mode": True}
    stdout = io.StringIO()
    was_controller, _internal.is_controller = _internal.is_controller, False
    try:
        with (
            patch_module_args(args),
            contextlib.redirect_stdout(stdout),
            contextlib.suppress(SystemExit),
        ):
            module.main()
    finally:
        _internal.is_controller = was_controller
    return json.loads(stdout.getvalue())


def assert_unchanged(result: dict) -> None:
    """A second run of a module: it succeeded first (a module that failed early changed nothing
    too), then it changed nothing."""
    assert not result.get("failed"), f"the module failed: {result.get('msg')}"
    assert result.get("changed") is False, f"it reported a change: {result}"


def marked_processes(marker: str, settle_s: float = 0.0) -> list[int]:
    """PIDs of live processes whose command line holds marker (zombies have exited): what a
    module's deadline must leave behind of a hung command is none. settle_s: how long a
    process already sent SIGKILL may take to finish exiting (it tears its memory down before
    it shows as a zombie, which on a loaded machine is not at once)."""
    deadline = time.monotonic() + settle_s
    found = _marked(marker)
    while found and time.monotonic() < deadline:
        time.sleep(0.05)
        found = _marked(marker)
    return found


def _marked(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmdline and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found
