"""speed_calibration: the program's arguments, routing, record and refusals without a GPU, the
program run bare against a stub torch, and the module against the test hosts' fake runtime
Python (tests/support/fakes/speed_calibration_python.py), which runs the real program with
figures in place of torch's."""

from __future__ import annotations

import ast
import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest
from ansible.module_utils.tuning import speed_calibration as sc
from ansible.module_utils.tuning import speed_calibration_run
from ansible.module_utils.tuning.speed_calibration import CalibrationError

from tests.support.modules import assert_unchanged, run_module

pytestmark = pytest.mark.tuning

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "module_utils" / "tuning" / "speed_calibration.py"
CONTRACT = REPO / "module_utils" / "tuning" / "speed_calibration_contract.py"
FAKE_PYTHON = REPO / "tests" / "support" / "fakes" / "speed_calibration_python.py"
CONTRACT_KEYS = {
    "schema",
    "kind",
    "measured_at",
    "gpu",
    "torch",
    "command",
    "copy_gbs",
    "read_gbs",
    "moe",
}
CONTRACT_MOE_KEYS = {
    "hidden",
    "intermediate",
    "experts",
    "top_k",
    "dtype",
    "weight_bytes",
    "l2_flushed",
    "seed",
    "rows",
}


# --------------------------------------------------------------------------------------------
# Arguments.


def test_tokens_are_sorted_whole_counts():
    assert sc.parse_tokens("257, 1,8") == [1, 8, 257]
    assert sc.parse_tokens(str(sc.MAX_TOKENS)) == [sc.MAX_TOKENS]


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("", "empty entry"),
        ("1,,8", "empty entry"),
        ("1,a", "'a', which is not a whole number"),
        ("1.5", "'1.5', which is not a whole number"),
        ("-1", "'-1', which is not a whole number"),
        ("0,8", "--tokens has 0"),
        ("8,9000", "--tokens has 9000"),
        ("8,8,17", "names 8 more than once"),
    ],
)
def test_bad_tokens_are_refused_saying_found_needed_fix(text, found):
    with pytest.raises(CalibrationError) as refused:
        sc.parse_tokens(text)
    message = str(refused.value)
    assert found in message and "Needed: " in message and "Fix: " in message, message
    assert refused.value.code == sc.EXIT_USAGE


def test_arguments_and_their_defaults(tmp_path):
    args = sc.parse_args(["--out", str(tmp_path / "r.json")])
    assert args.tokens == list(sc.DEFAULT_TOKENS)
    assert (args.gpu, args.repeats, args.deadline_s) == (0, 20, 300.0)
    assert sc.command_line(args) == (
        "speed_calibration.py --gpu 0 --tokens 1,8,17,33,65,129,257 --repeats 20 --deadline-s 300"
    )


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        ([], "the following arguments are required: --out"),
        (["--repeats", "0"], "--repeats is 0"),
        (["--repeats", "x"], "invalid int value"),
        (["--gpu", "-1"], "--gpu is -1"),
        (["--deadline-s", "0"], "--deadline-s is 0"),
        (["--deadline-s", "nan"], "--deadline-s is nan"),
        (["--deadline-s", "7200"], "at most 3600"),
        (["--tokens", "1,x"], "not a whole number"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_arguments_are_refused(tmp_path, argv, said):
    out = [] if argv == [] else ["--out", str(tmp_path / "r.json")]
    with pytest.raises(CalibrationError) as refused:
        sc.parse_args(out + argv)
    assert said in str(refused.value)
    assert refused.value.code == sc.EXIT_USAGE


def test_out_must_be_a_file(tmp_path):
    with pytest.raises(CalibrationError, match="a folder"):
        sc.parse_args(["--out", str(tmp_path)])


# --------------------------------------------------------------------------------------------
# Routing.


def test_routing_is_fixed_uniform_and_distinct():
    first = sc.draw_routing(65)
    assert first == sc.draw_routing(65)
    assert all(len(set(chosen)) == sc.TOP_K for chosen in first)
    assert all(0 <= expert < sc.EXPERTS for chosen in first for expert in chosen)
    # A row's draw does not depend on the other token counts measured.
    assert sc.draw_routing(8) == sc.draw_routing(8) and sc.draw_routing(8) != first[:8]
    assert sc.experts_touched([[1, 2], [2, 3]]) == 3


def test_experts_touched_follow_the_formula():
    """The formula E(1 - (1 - k/E)^T) against the mean of many draws of this routing."""
    for tokens in (8, 33, 129):
        draws = [sc.draw_routing(tokens, seed=seed) for seed in range(40)]
        mean = sum(sc.experts_touched(draw) for draw in draws) / len(draws)
        assert mean == pytest.approx(sc.expected_touched(tokens), rel=0.02)
    # The one draw each row records is within 10% of it, and 257 tokens read almost every expert.
    for tokens in sc.DEFAULT_TOKENS:
        touched = sc.experts_touched(sc.draw_routing(tokens))
        assert touched == pytest.approx(sc.expected_touched(tokens), rel=0.1)
    assert sc.experts_touched(sc.draw_routing(1)) == sc.TOP_K
    assert sc.experts_touched(sc.draw_routing(257)) >= 380


# --------------------------------------------------------------------------------------------
# The record.


def measurement(tokens=(1, 8, 65), repeats=3, **overrides) -> tuple[dict, dict]:
    routings = {t: sc.draw_routing(t) for t in tokens}
    measured = {
        "gpu": {"name": "NVIDIA H200", "compute_capability": "9.0", "memory_mib": 143155},
        "torch": "2.11.0+cu130",
        "copy_bytes": 4 << 30,
        # 2 x 4 GiB in 2.0 ms, 4 GiB in 1.0 ms: 4294.97 GB/s both.
        "copy_ms": [2.1, 2.0, 1.9],
        "read_ms": [1.0, 1.2, 0.9],
        "kernel": sc.KERNEL_GROUPED,
        "launch": "cuda_graph",
        "moe_ms": {t: [0.05 + 0.01 * t + 0.001 * i for i in range(repeats)] for t in tokens},
        **overrides,
    }
    return measured, routings


def test_record_holds_the_contract_and_passes_its_check():
    measured, routings = measurement()
    record = sc.make_record(measured, routings, "speed_calibration.py ...", "2026-12-02T10:00:00Z")
    assert set(record) >= CONTRACT_KEYS and set(record["moe"]) >= CONTRACT_MOE_KEYS
    assert record["copy_gbs"] == pytest.approx(4295.0, abs=0.1)
    assert record["read_gbs"] == pytest.approx(4295.0, abs=0.1)
    assert record["moe"]["rows"][0] == {
        "tokens": 1,
        "experts_touched": 8,
        "ms": 0.061,
        "repeats": 3,
    }
    assert [row["tokens"] for row in record["moe"]["rows"]] == [1, 8, 65]
    assert record["moe"]["rows"][2]["experts_touched"] == sc.experts_touched(routings[65])
    assert record["moe"] | {"rows": None} == {
        "hidden": 7168,
        "intermediate": 256,
        "experts": 384,
        "top_k": 8,
        "dtype": "bfloat16",
        "weight_bytes": 2,
        "l2_flushed": True,
        "seed": 0,
        "kernel": "torch._grouped_mm",
        "launch": "cuda_graph",
        "rows": None,
    }
    assert sc.record_problems(record) == []
    assert sc.record_problems(json.loads(json.dumps(record))) == []


def good_record() -> dict:
    measured, routings = measurement()
    return sc.make_record(measured, routings, "speed_calibration.py", "2026-12-02T10:00:00Z")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda r: r.update(schema=2), "schema is 2"),
        (lambda r: r.update(kind="other"), "kind is 'other'"),
        (lambda r: r.update(measured_at="yesterday"), "measured_at is 'yesterday'"),
        (lambda r: r.pop("gpu"), "gpu is missing"),
        (lambda r: r["gpu"].update(compute_capability=9.0), "gpu.compute_capability is 9.0"),
        (lambda r: r["gpu"].update(memory_mib=True), "gpu.memory_mib is True"),
        (lambda r: r.update(torch=""), "torch is missing"),
        (lambda r: r.update(copy_gbs=0), "copy_gbs is 0"),
        (lambda r: r.update(read_gbs=float("inf")), "read_gbs is inf"),
        (lambda r: r.update(copy_gbs="4300"), "copy_gbs is '4300'"),
        (lambda r: r["moe"].update(hidden=4096), "moe.hidden is 4096"),
        (lambda r: r["moe"].update(l2_flushed=1), "moe.l2_flushed is 1"),
        (lambda r: r["moe"].update(rows=[]), "moe.rows is missing or empty"),
        (lambda r: r["moe"]["rows"].reverse(), "needed above the row before"),
        (lambda r: r["moe"]["rows"][0].update(experts_touched=9), "needed 8 to 8 for 1 tokens"),
        (lambda r: r["moe"]["rows"][1].update(ms=-1.0), "moe.rows[1].ms is -1.0"),
        (lambda r: r["moe"]["rows"][1].update(repeats=0), "moe.rows[1].repeats is 0"),
        (lambda r: r["moe"]["rows"].append("x"), "moe.rows[3] is not an object"),
    ],
)
def test_record_problems_name_each_fault(change, problem):
    record = good_record()
    change(record)
    problems = sc.record_problems(record)
    assert any(problem in line for line in problems), problems


def test_a_record_that_is_no_object():
    assert sc.record_problems([1]) == ["the record is a list, not a JSON object"]


# --------------------------------------------------------------------------------------------
# The program, with a measurement handed in.


def fake_measure(args, routings, deadline):
    measured, _ = measurement(tuple(routings), args.repeats)
    return measured


def run_main(argv, capsys, measure=fake_measure) -> tuple[int, str, str]:
    code = sc.main(argv, measure=measure)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_main_writes_the_record_beside_and_renames_it(tmp_path, capsys):
    out = tmp_path / "state" / "speed-calibration.json"
    code, stdout, stderr = run_main(
        ["--out", str(out), "--tokens", "8,1", "--repeats", "3"], capsys
    )
    assert code == 0, stderr
    record = json.loads(out.read_text())
    assert sc.record_problems(record) == []
    assert [row["tokens"] for row in record["moe"]["rows"]] == [1, 8]
    assert record["command"].endswith("--tokens 1,8 --repeats 3 --deadline-s 300")
    assert json.loads(stdout.strip().removeprefix(sc.MARKER)) == record
    assert os.listdir(out.parent) == [out.name], "a temporary file was left beside the record"
    assert oct(out.stat().st_mode & 0o777) == "0o644"
    assert "tokens  touched  expected" in stderr


def test_main_refuses_with_a_marked_error_and_its_exit_code(tmp_path, capsys):
    def no_memory(args, routings, deadline):
        sc.check_memory(2 << 30, 6 << 30, 0, "NVIDIA H200")

    code, stdout, stderr = run_main(["--out", str(tmp_path / "r.json")], capsys, no_memory)
    assert code == sc.EXIT_MEMORY
    error = json.loads(stdout.strip().removeprefix(sc.ERROR_MARKER))
    assert error["error"] == "memory"
    assert "GPU 0 (NVIDIA H200) has 2048 MiB free. Needed: 6144 MiB free" in error["msg"]
    assert "teardown.yml --tags server" in error["msg"]
    assert not (tmp_path / "r.json").exists()
    assert stderr.startswith("speed_calibration: GPU 0")


def test_main_stops_at_its_deadline(tmp_path, capsys):
    def slow(args, routings, deadline):
        time.sleep(0.2)
        deadline.check("timing 8 tokens")

    argv = ["--out", str(tmp_path / "r.json"), "--deadline-s", "0.05"]
    code, stdout, _ = run_main(argv, capsys, slow)
    assert code == sc.EXIT_DEADLINE
    assert "passed its deadline of 0.05 s while timing 8 tokens" in stdout


def test_main_refuses_an_unusable_measurement(tmp_path, capsys):
    def zero(args, routings, deadline):
        measured, _ = measurement(tuple(routings), args.repeats, read_ms=[0.0, 0.0, 0.0])
        return measured

    code, stdout, _ = run_main(["--out", str(tmp_path / "r.json")], capsys, zero)
    assert code == sc.EXIT_MEASURE
    assert "read_gbs is" in stdout


def test_main_says_when_the_record_cannot_be_written(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, stdout, _ = run_main(["--out", str(blocker / "r.json")], capsys)
    assert code == sc.EXIT_WRITE
    assert "cannot write" in stdout and "choose another --out" in stdout


# --------------------------------------------------------------------------------------------
# The program run bare, against a stub torch.

STUB_TORCH = """\
import os, types
__version__ = "2.11.0+cu130"
version = types.SimpleNamespace(cuda=os.environ.get("STUB_CUDA") or None)
gpus = int(os.environ.get("STUB_GPUS", "0"))
free = int(os.environ.get("STUB_FREE", "0"))
props = types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0, L2_cache_size=62914560,
                              total_memory=150109880320)
cuda = types.SimpleNamespace(
    is_available=lambda: gpus > 0,
    device_count=lambda: gpus,
    set_device=lambda device: None,
    get_device_properties=lambda device: props,
    mem_get_info=lambda device: (free, props.total_memory),
)
def device(kind, index):
    return (kind, index)
"""


def run_bare(
    tmp_path, stub: str | None, *args, program: Path = PROGRAM, **env
) -> tuple[int, dict, str]:
    environ = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    if stub is not None:
        package = tmp_path / "stub" / "torch"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(stub)
        environ["PYTHONPATH"] = str(package.parent)
    import subprocess

    done = subprocess.run(
        [sys.executable, str(program), "--out", str(tmp_path / "r.json"), *args],
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    error = json.loads(done.stdout.strip().removeprefix(sc.ERROR_MARKER) or "{}")
    return done.returncode, error, done.stderr


def test_bare_without_cuda(tmp_path):
    code, error, stderr = run_bare(tmp_path, STUB_TORCH)
    assert code == sc.EXIT_NO_GPU, stderr
    assert error["error"] == "no_cuda"
    assert "torch 2.11.0+cu130 (a CPU-only build) sees no CUDA GPU" in error["msg"]


def test_bare_with_another_gpu_index(tmp_path):
    code, error, _ = run_bare(tmp_path, STUB_TORCH, "--gpu", "3", STUB_GPUS="1", STUB_CUDA="13.0")
    assert code == sc.EXIT_NO_GPU
    assert "--gpu is 3 and torch sees 1 GPU(s)" in error["msg"]


def test_bare_with_too_little_free_memory(tmp_path):
    code, error, _ = run_bare(
        tmp_path, STUB_TORCH, STUB_GPUS="1", STUB_CUDA="13.0", STUB_FREE=str(3 << 30)
    )
    assert code == sc.EXIT_MEMORY
    flush = max(sc.MIN_FLUSH_BYTES, 4 * 62914560)
    needed = sc.moe_bytes_needed(257, flush) + sc.RESERVE_BYTES
    assert f"has 3072 MiB free. Needed: {needed >> 20} MiB free" in error["msg"]


def test_bare_without_torch(tmp_path):
    code, error, _ = run_bare(tmp_path, "raise ImportError('libcudart.so.13: cannot open')")
    assert code == sc.EXIT_NO_TORCH
    assert "cannot import torch (ImportError: libcudart.so.13: cannot open)" in error["msg"]
    assert "runtime's Python" in error["msg"]


# --------------------------------------------------------------------------------------------
# The module, against the fake runtime Python.


def calibrate(record_file: Path, check_mode: bool = False, **args) -> dict:
    params = {"python": str(FAKE_PYTHON), "record_file": str(record_file), "repeats": 2, **args}
    return run_module("speed_calibration", params, check_mode=check_mode)


@pytest.fixture
def runs(tmp_path, monkeypatch):
    log = tmp_path / "measurements.log"
    monkeypatch.setenv("FAKE_CALIBRATION_LOG", str(log))
    return lambda: len(log.read_text().splitlines()) if log.exists() else 0


def test_the_program_shipped_is_the_two_files():
    shipped = speed_calibration_run.program_source()
    head, _, rest = PROGRAM.read_text().partition(speed_calibration_run.CONTRACT_START)
    tail = rest.partition(speed_calibration_run.CONTRACT_END)[2]
    head = head.replace(speed_calibration_run.FUTURE, "", 1)
    assert shipped == CONTRACT.read_text() + "\n\n" + head + tail
    # One program, standard library only: neither the kit nor the contract's file is imported.
    imported = set()
    for node in ast.walk(ast.parse(shipped)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__", "torch"}, imported


def test_the_program_shipped_runs_bare_on_its_own(tmp_path):
    shipped = tmp_path / "alone" / "speed_calibration.py"
    shipped.parent.mkdir()
    shipped.write_text(speed_calibration_run.program_source())
    code, error, _ = run_bare(tmp_path, STUB_TORCH, program=shipped)
    assert code == sc.EXIT_NO_GPU and error["error"] == "no_cuda"


def test_measures_once_then_keeps_the_record(tmp_path, runs):
    record_file = tmp_path / "var" / "speed-calibration.json"
    first = calibrate(record_file)
    assert not first.get("failed"), first.get("msg")
    assert first["changed"] is True and first["measured"] is True and runs() == 1
    on_host = json.loads(record_file.read_text())
    assert on_host == first["record"] and sc.record_problems(on_host) == []
    assert on_host["command"].endswith("--repeats 2 --deadline-s 570")
    assert first["msg"].startswith("Measured. NVIDIA H200 (")
    second = calibrate(record_file)
    assert_unchanged(second)
    assert second["measured"] is False and second["record"] == on_host and runs() == 1
    assert "rerun: true measures again" in second["msg"]
    again = calibrate(record_file, rerun=True, tokens=[1, 8])
    assert again["changed"] is True and runs() == 2
    assert [row["tokens"] for row in json.loads(record_file.read_text())["moe"]["rows"]] == [1, 8]


def test_check_mode_runs_nothing(tmp_path, runs):
    record_file = tmp_path / "speed-calibration.json"
    would = calibrate(record_file, check_mode=True)
    assert would["changed"] is True and would["record"] is None and "check mode" in would["msg"]
    assert not record_file.exists() and runs() == 0
    calibrate(record_file)
    kept = calibrate(record_file, check_mode=True)
    assert kept["changed"] is False and kept["record"]["kind"] == sc.KIND and runs() == 1


def test_an_unusable_record_is_measured_again(tmp_path, runs):
    record_file = tmp_path / "speed-calibration.json"
    record_file.write_text(json.dumps({"schema": 1, "kind": sc.KIND}))
    result = calibrate(record_file)
    assert result["changed"] is True and runs() == 1
    assert "is not a usable record (measured_at is None" in json.dumps(result["warnings"])
    record_file.write_text("{not json")
    assert calibrate(record_file)["changed"] is True and runs() == 2


def test_the_programs_refusal_is_the_modules_message(tmp_path, monkeypatch):
    package = tmp_path / "stub" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(STUB_TORCH)
    monkeypatch.setenv("PYTHONPATH", str(package.parent))
    monkeypatch.setenv("STUB_GPUS", "0")
    result = calibrate(tmp_path / "r.json", python=sys.executable)
    assert result["failed"] is True and result["error"] == "no_cuda"
    assert result["msg"].startswith(f"The calibration with {sys.executable} failed: torch 2.11")
    assert result["rc"] == sc.EXIT_NO_GPU and result["measured"] is False
    assert not (tmp_path / "r.json").exists()


def test_a_program_that_dies_without_a_word(tmp_path):
    dies = tmp_path / "python"
    dies.write_text(f"#!{sys.executable}\nimport sys\nprint('Segmentation fault')\nsys.exit(139)\n")
    dies.chmod(0o755)
    result = calibrate(tmp_path / "r.json", python=str(dies))
    assert result["failed"] is True and "exited 139 without saying why" in result["msg"]
    assert "Segmentation fault" in result["msg"]


def test_a_hung_program_is_killed_at_the_timeout(tmp_path, monkeypatch):
    hangs = tmp_path / "python"
    hangs.write_text(
        textwrap.dedent(
            f"""\
            #!{sys.executable}
            import subprocess, sys, time
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            time.sleep(60)
            """
        )
    )
    hangs.chmod(0o755)
    # The program's own deadline would stop it first; here it hangs in a "GPU call".
    monkeypatch.setattr(speed_calibration_run, "PROGRAM_MARGIN_S", 0)
    started = time.monotonic()
    result = calibrate(tmp_path / "r.json", python=str(hangs), timeout=2)
    assert time.monotonic() - started < 15
    assert result["failed"] is True and result["timed_out"] is True
    assert "did not finish within 2s (speed_calibration's timeout=2s)" in result["msg"]


def test_missing_python_and_bad_parameters(tmp_path):
    missing = calibrate(tmp_path / "r.json", python=str(tmp_path / "nowhere" / "python"))
    assert missing["failed"] is True and "python not found" in missing["msg"]
    bad = calibrate(Path("relative.json"), tokens=[0, 8], repeats=0, gpu=-1, timeout=10)
    assert bad["failed"] is True
    for said in (
        "tokens has 0",
        "repeats is 0",
        "gpu is -1",
        "timeout is 10",
        "needed: an absolute path",
    ):
        assert said in bad["msg"], bad["msg"]


def test_fake_python_runs_other_programs_as_python(tmp_path):
    import subprocess

    done = subprocess.run(
        [str(FAKE_PYTHON), "-c", "print(6 * 7)"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert done.stdout.strip() == "42"
