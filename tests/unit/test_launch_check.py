"""The deploy-time launch check: argv parsed by the installed runtime's own parser.

Unit tests run the probe (module_utils/server/launch_check.py) in this Python against the test
runtimes' packages (tests/support/fake_sglang.py: the release flavour, and the fake DDTree
pull-request flavour), and against the real sglang 0.5.23 where `make test-contract` built its
venv. The
integration test runs the server role over an SSH test host: a flag the user added in
kimi_server_settings.extra_args that the runtime does not know fails the deploy naming it, and
the running server is left as it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible.module_utils.host.helpers import marked_json
from ansible.module_utils.server import launch_probe
from ansible.module_utils.server.launch_check import (
    errors_of,
    flag_in,
    probe_argv,
    probe_source,
)

from tests.support.fake_sglang import write_package

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.runtime
CONTRACT_PYTHON = REPO / "tests" / ".state" / "contract-venv" / "bin" / "python"

BASE = [
    "--model-path", "/w/t",
    "--trust-remote-code",
    "--tp-size", "8",
    "--attention-backend", "triton",
    "--host", "127.0.0.1",
    "--port", "30000",
    "--enable-metrics",
]  # fmt: skip
DDTREE = [
    "--speculative-algorithm", "DDTREE",
    "--speculative-draft-model-path", "/w/d",
    "--speculative-num-draft-tokens", "8",
    "--speculative-dflash-block-size", "8",
    "--page-size", "1",
    "--disable-overlap-schedule",
    "--speculative-ddtree-budget", "16",
]  # fmt: skip


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    root = tmp_path_factory.mktemp("fake-sglang")
    return {
        "release": write_package(root / "release"),
        "git": write_package(root / "git", version="0.5.23.dev1", ddtree=True),
    }


def run_probe(argv, pythonpath=None, python=sys.executable, deadline=60):
    env = {"PATH": "/usr/bin:/bin"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [str(python), "-c", probe_source(), str(deadline)],
        input=json.dumps(argv),
        capture_output=True,
        text=True,
        env=env,
        timeout=deadline + 60,
        check=False,
    )


def probe(argv, pythonpath=None, python=sys.executable, deadline=60):
    done = run_probe(argv, pythonpath, python, deadline)
    result = parse_probe_output(done.stdout)
    assert result is not None, done.stderr[-2000:]
    return result, errors_of(result, argv)


def test_the_release_parser_builds_the_whole_record(packages):
    result, errors = probe([*BASE, "--speculative-algorithm", "DFLASH"], packages["release"])
    assert result["mode"] == "prepare_server_args"  # lazy record, as in 0.5.23
    assert result["version"] == "0.5.23"
    assert errors[0].flag == "--speculative-draft-model-path"
    result, errors = probe(BASE, packages["release"])
    assert result["ok"] and errors == []
    assert result["values"]["tp_size"] == 8


@pytest.mark.parametrize(
    "extra, flag, text",
    [
        (["--not-a-flag", "1"], "--not-a-flag", "unrecognized arguments: --not-a-flag 1"),
        (["--tp-size", "eight"], "--tp-size", "invalid int value: 'eight'"),
        (["--attention-backend", "fa9"], "--attention-backend", "invalid choice: 'fa9'"),
        (["--page-size"], "--page-size", "expected one argument"),
    ],
)
def test_the_release_parser_names_the_flag_it_refuses(packages, extra, flag, text):
    result, errors = probe([*BASE, *extra], packages["release"])
    assert result["ok"] is False
    [error] = errors
    assert error.flag == flag
    assert text in str(error)


def test_the_release_refuses_ddtree_and_the_git_runtime_takes_it(packages):
    _, errors = probe([*BASE, *DDTREE], packages["release"])
    assert errors[0].flag == "--speculative-ddtree-budget"
    _, errors = probe([*BASE, *DDTREE[:-2]], packages["release"])
    assert errors[0].flag == "--speculative-algorithm"
    assert "Unknown speculative algorithm name: DDTREE" in str(errors[0])
    result, errors = probe([*BASE, *DDTREE], packages["git"])
    # Building the pull request's record reads the model and the GPU: argparse only.
    assert result["mode"] == "add_cli_args"
    assert result["version"] == "0.5.23.dev1"
    assert errors == []


@pytest.mark.parametrize(
    "extra, flag, text",
    [
        (["--speculative-ddtree-budgt", "16"], "--speculative-ddtree-budgt", "unrecognized"),
        (["--page-size", "16"], "--page-size", "only --page-size 1"),
        (["--attention-backend", "flashinfer"], "--attention-backend", "triton"),
        (["--speculative-ddtree-budget", "0"], "--speculative-ddtree-budget", ">= 1"),
        (
            ["--speculative-use-rejection-sampling"],
            "--speculative-use-rejection-sampling",
            "does not support",
        ),
    ],
)
def test_the_git_runtime_applies_the_pull_requests_rules(packages, extra, flag, text):
    """Later flags win in argparse, as on a real command line."""
    _, errors = probe([*BASE, *DDTREE, *extra], packages["git"])
    assert errors, extra
    assert errors[0].flag == flag
    assert text in str(errors[0])


def test_the_kits_secrets_file_is_left_out_and_others_are_merged(packages, tmp_path):
    argv = ["/v/bin/python", "-m", "sglang.launch_server", *BASE, "--config", "/etc/kimi/s.yaml"]
    assert probe_argv(argv, "/etc/kimi/s.yaml") == BASE
    assert probe_argv(argv, "/other.yaml") == [*BASE, "--config", "/etc/kimi/s.yaml"]
    own = tmp_path / "own.yaml"
    own.write_text("tp_size: four\n")
    # A --config of the user's own goes through the runtime's own merger.
    for flavour in ("release", "git"):
        _, errors = probe([*BASE, "--config", str(own)], packages[flavour])
        assert errors and errors[0].flag == "--tp-size", flavour


def test_a_runtime_that_hangs_is_stopped_at_its_deadline(tmp_path):
    package = write_package(tmp_path / "slow")
    (package / "sglang" / "srt" / "server_args.py").write_text("import time\ntime.sleep(60)\n")
    started = time.monotonic()
    done = run_probe(BASE, package, deadline=1)
    assert time.monotonic() - started < 20
    assert done.returncode == launch_probe.EXIT_DEADLINE
    result = parse_probe_output(done.stdout)
    assert result["stage"] == "deadline"
    assert "did not answer within 1 s" in str(errors_of(result, BASE)[0])


def test_the_probe_runs_without_ansible_and_says_sglang_is_missing(tmp_path):
    """As the host runs it: the standard library alone (-I -S), no sglang to import."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe_source(), "30"],
        input=json.dumps(BASE),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = parse_probe_output(done.stdout)
    assert result["ok"] is False and result["stage"] == "import"
    assert result["error"] == "ModuleNotFoundError: No module named 'sglang'"
    [error] = errors_of(result, BASE)
    assert str(error).startswith("ModuleNotFoundError")


def test_probe_output_is_read_back_with_the_same_marker():
    out = {"ok": True, "mode": "add_cli_args", "values": {"tp_size": 8}}
    line = launch_probe.report_line(out)
    assert line.startswith("KIMI-LAUNCH-CHECK {")
    assert parse_probe_output("a warning\n" + line + "\n") == out
    assert parse_probe_output(line.replace(launch_probe.MARKER, "OTHER ")) is None
    assert parse_probe_output(launch_probe.MARKER + "{cut") is None
    assert parse_probe_output(launch_probe.MARKER + "[1]") is None


def parse_probe_output(stdout: str) -> dict | None:
    """The probe's report, read as library/launch_check.py reads it."""
    return marked_json(stdout, launch_probe.MARKER)


def test_probe_turns_parser_values_into_json():
    class Backend:
        def __str__(self):
            return "triton"

    values = {"a": (1, 2.5, None), "b": {3: Backend()}, "c": [True, "x"]}
    assert launch_probe.plain(values) == {
        "a": [1, 2.5, None],
        "b": {"3": "triton"},
        "c": [True, "x"],
    }
    json.dumps(launch_probe.plain(values))


def test_probe_reads_every_kind_of_server_args_record():
    import dataclasses

    @dataclasses.dataclass
    class Old:
        tp_size: int = 8
        page_size: int = 1

    class Struct:  # msgspec.Struct keeps its field names here, and has no __dict__ of them
        __struct_fields__ = ("tp_size", "speculative_algorithm")
        __slots__ = ("speculative_algorithm", "tp_size")

        def __init__(self):
            self.tp_size = 4
            self.speculative_algorithm = "DFLASH"

    class Plain:
        def __init__(self):
            self.tp_size = 2

    assert launch_probe.record_values(Old()) == {"tp_size": 8, "page_size": 1}
    assert launch_probe.record_values(Struct()) == {"tp_size": 4, "speculative_algorithm": "DFLASH"}
    assert launch_probe.record_values(Plain()) == {"tp_size": 2}


def test_probe_keeps_argparses_reason_not_its_usage():
    usage = "usage: sglang serve [-h] [--tp-size TP_SIZE]\n  [--page-size PAGE_SIZE]\n"
    said = usage + "sglang serve: error: argument --tp-size: invalid int value: 'x'\n"
    assert launch_probe.parser_error(said, 2) == (
        "sglang serve: error: argument --tp-size: invalid int value: 'x'"
    )
    assert launch_probe.parser_error("something else\nlast line\n", 2) == "last line"
    assert launch_probe.parser_error("", 2) == "the parser exited with 2"


def test_flag_names_in_argparse_messages():
    argv = ["--tensor-parallel-size", "x"]
    message = "error: argument --tp-size/--tensor-parallel-size: invalid int value: 'x'"
    assert flag_in(message, argv) == "--tensor-parallel-size"
    assert flag_in("error: unrecognized arguments: --foo=3 --bar", []) == "--foo"
    assert flag_in("error: the following arguments are required: --model-path", []) == (
        "--model-path"
    )


@pytest.mark.skipif(
    not CONTRACT_PYTHON.is_file() and os.environ.get("KIT_REQUIRE_REAL_SGLANG") != "1",
    reason="the real sglang 0.5.23 venv is built by `make test-contract`",
)
def test_the_real_release_parser_is_model_free():
    """sglang 0.5.23's prepare_server_args, whole, in its own venv (CPU only, no model)."""
    result, errors = probe(BASE, python=CONTRACT_PYTHON, deadline=240)
    assert (result["mode"], result["version"], errors) == ("prepare_server_args", "0.5.23", [])
    _, errors = probe([*BASE, "--not-a-flag", "1"], python=CONTRACT_PYTHON, deadline=240)
    assert errors[0].flag == "--not-a-flag"
    _, errors = probe([*BASE, *DDTREE[:-2]], python=CONTRACT_PYTHON, deadline=240)
    assert errors[0].flag == "--speculative-algorithm"
    assert "Unknown speculative algorithm name: DDTREE" in str(errors[0])


# --- over an SSH test host ---------------------------------------------------------------


def test_server_inspect_checks_the_launch_in_its_own_run_as_launch_check_does(packages, tmp_path):
    """The server role's one module run before a start: the same facts as launch_check's, the
    same refusal naming the flag, and no check where the launch's Python is not there."""
    from tests.support.modules import run_module

    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nPYTHONPATH={packages["release"]} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    facts = ("ok", "mode", "version", "errors", "flags")

    def both(argv: list[str]) -> tuple[dict, dict]:
        launch = {"argv": argv, "name": "ar", "timeout": 60}
        alone = run_module("launch_check", {"python": str(python), **launch})
        inspected = run_module(
            "server_inspect", {"manager": "supervisor", "python": str(python), "launch": launch}
        )
        return alone, inspected

    alone, inspected = both(BASE)
    assert not alone.get("failed") and not inspected.get("failed"), (alone, inspected)
    assert inspected["python_exists"] and inspected["mode"] == "prepare_server_args"
    assert {key: inspected[key] for key in facts} == {key: alone[key] for key in facts}
    alone, inspected = both([*BASE, "--enable-metricz"])
    assert inspected["failed"] and inspected["msg"] == alone["msg"]
    assert inspected["flags"] == alone["flags"] == ["--enable-metricz"]
    assert "The running server was left as it is" in inspected["msg"]
    absent = run_module(
        "server_inspect",
        {
            "manager": "supervisor",
            "python": str(tmp_path / "none" / "bin" / "python"),
            "launch": {"argv": BASE},
        },
        check_mode=True,
    )
    assert not absent.get("failed") and absent["python_exists"] is False and "mode" not in absent
