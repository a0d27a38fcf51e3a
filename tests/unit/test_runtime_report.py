"""What the runtime stage records of a runtime about itself (module_utils/runtime/report.py,
runtime_check's check_env and kernels): the kernel packages' versions from the probe's list,
and `python -m sglang.check_env` run in the environment, bounded and scrubbed, a failure
recorded rather than fatal. The test runtime's check_env is tests/support/sim_check_env.py, as
the fake sglang package ships it; tests/integration/test_deploy.py reads it from runtime.json."""

from __future__ import annotations

import subprocess
import sys

import pytest
from ansible.module_utils.runtime import report as runtime_report

from tests.support.fake_sglang import write_package
from tests.support.modules import run_module

pytestmark = pytest.mark.runtime

TOKEN = "hf_" + "Q" * 34
KEY = "sk-report-key-0d9a7c"


def test_kernel_versions_name_each_kernel_package_found_or_not():
    kernels = runtime_report.kernel_versions(
        {"sglang-kernel": "0.4.10", "flashinfer-python": "0.7.2", "torch": "2.14.1", "x": "1"}
    )
    assert kernels["sglang-kernel"] == "0.4.10" and kernels["flashinfer-python"] == "0.7.2"
    assert kernels["sgl-kernel"] is None and kernels["sgl-flash-mla"] is None
    assert set(kernels) == set(runtime_report.KERNEL_PACKAGES)
    # Outside input: a list or a number where a mapping and strings belong is no version.
    assert set(runtime_report.kernel_versions(["torch"]).values()) == {None}
    assert runtime_report.kernel_versions({"torch": 2})["torch"] is None


def test_check_env_output_is_bounded_and_scrubbed():
    printed = f"Python: 3.12\nHF_TOKEN={TOKEN}\napi_key={KEY}\n" + "x" * (
        runtime_report.CHECK_ENV_MAX_CHARS * 2
    )
    record = runtime_report.check_env_record(0, printed, "")
    assert record["ok"] is True and record["truncated"] is True and record["error"] is None
    assert len(record["output"]) == runtime_report.CHECK_ENV_MAX_CHARS
    assert TOKEN not in record["output"] and KEY not in record["output"]
    assert record["output"].startswith("Python: 3.12\n")
    failed = runtime_report.check_env_record(
        1, "", "Traceback ...\n" + "y" * 5000 + f"\nRuntimeError: token {TOKEN}"
    )
    assert failed["ok"] is False and failed["rc"] == 1
    assert failed["error"].endswith("RuntimeError: token ********")
    assert len(failed["error"]) <= runtime_report.ERROR_MAX_CHARS
    silent = runtime_report.check_env_record(3, "", "")
    assert silent["error"] == "exited with 3 and printed nothing on stderr"


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    """A venv (with pip, which the probe reads requirements with) holding the test runtime's
    sglang package, its check_env among it."""
    root = tmp_path_factory.mktemp("report-runtime")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    site = next((venv / "lib").glob("python3.*")) / "site-packages"
    write_package(site)
    info = site / "sglang-0.5.23.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    return venv / "bin" / "python"


def check(python, **more) -> dict:
    result = run_module(
        "runtime_check",
        {"python": str(python), "check_env": True, "fail_on_mismatch": False, **more},
    )
    assert not result.get("failed"), result
    return result["ansible_facts"]["kimi_runtime"]


def test_runtime_check_records_check_env_and_the_kernels(runtime, monkeypatch):
    record = check(runtime)
    env = record["check_env"]
    assert env["ok"] is True and env["rc"] == 0 and env["command"] == "python -m sglang.check_env"
    lines = env["output"].splitlines()
    # sglang 0.5.23's order: Python, the GPUs (none on this machine), PyTorch, PACKAGE_LIST.
    assert lines[0].startswith("Python: ") and "sglang: 0.5.23" in lines
    assert "sglang-kernel: Module Not Found" in lines
    assert record["kernels"]["sglang-kernel"] is None
    # A second run records the same bytes: runtime.json stays unchanged on a second deploy.
    assert check(runtime)["check_env"] == env
    monkeypatch.setenv("SGLANG_SIM_CHECK_ENV", "fail")
    failed = check(runtime)["check_env"]
    assert failed["ok"] is False and failed["rc"] == 1
    assert failed["error"].endswith("RuntimeError: CUDA driver initialization failed")


def test_runtime_check_leaves_check_env_out_unless_asked(runtime):
    result = run_module("runtime_check", {"python": str(runtime), "fail_on_mismatch": False})
    assert "check_env" not in result["ansible_facts"]["kimi_runtime"]
    assert "kernels" in result["ansible_facts"]["kimi_runtime"]
