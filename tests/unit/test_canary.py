"""The canary (module_utils/canary/serve.py, serve_failures.py, serve_inputs.py, serve_record.py):
each known failure text classified with its hint, the log's first error line scrubbed of
secrets, identities, the record's schema, and the deadlines of a real process: one that never
opens its port, one that hangs on /generate, one that crashes, one that serves. The servers are
the SGLang simulator packaged as the runtime is (tests/support/fake_sglang.py), started as a
canary launches them."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from ansible.module_utils.canary import serve as canary
from ansible.module_utils.canary.serve_failures import (
    KNOWN_FAILURES,
    first_error,
    hint,
    known_failure,
)
from ansible.module_utils.canary.serve_inputs import CanaryError, identity, source_files
from ansible.module_utils.canary.serve_record import (
    build_record,
    read_record,
    skipped,
    validate_record,
    write_record,
)

from tests.support.fake_sglang import write_package
from tests.support.safetensors_files import tiny_folders
from tests.support.secret_scan import derived_forms

pytestmark = pytest.mark.runtime

API_KEY = "sk-canary-unit-5d2f7a91c3"
HF_TOKEN = "hf_canaryUnitTokenAbcdefghijklmnopqrstuv12"
CAPABILITIES = {
    "fa3": ["9.0"],
    "trtllm_mla": ["10.0", "10.3"],
    "fa4": ["10.0", "10.3"],
    "flashinfer": ["9.0", "10.0", "12.0"],
    "triton": ["9.0", "10.0", "12.0"],
}

# Each known failure's text as SGLang (or CUDA, the loader, torch) prints it, and its kind.
TEXTS = {
    "AssertionError: FlashAttention v3 Backend requires SM>=80 and SM<=90. Please use "
    "`--attention-backend flashinfer`.": "attention_backend",
    "ValueError: TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x). "
    "Please use a different backend.": "attention_backend",
    "ValueError: TRTLLM MHA backend for prefill requires Hopper (SM90), Blackwell (SM100), or "
    "SM120 GPUs. Please use a different prefill backend.": "attention_backend",
    "ValueError: trtllm_mla backend can only be used with MLA models.": "attention_backend",
    "ValueError: trtllm_mha backend can only be used with non-MLA models.": "attention_backend",
    "AssertionError: (head_dim, head_dim_v)=(64, 512) is not supported on SM90. head_dim and "
    "head_dim_v must be between 8 and 256 and divisible by 8, or both equal to 512.": (
        "attention_backend"
    ),
    "AssertionError: Unsupported compute capability. Supported: 8.x, 9.x, 10.x, 11.x, and "
    "architectures registered through the forward-host bridge": "attention_backend",
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current "
    "value: mem_fraction_static=0.3": "out_of_memory",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 95.00 GiB of which 1.00 GiB is free.": "out_of_memory",
    "torch.AcceleratorError: CUDA error: no kernel image is available for execution on the "
    "device": "missing_kernel",
    "ImportError: /opt/kimi/venv/lib/python3.12/site-packages/sgl_kernel/common_ops.abi3.so: "
    "undefined symbol: _ZN3c104cuda9SetDeviceEa": "missing_kernel",
    "RuntimeError: flashinfer kernels are not built for sm_120": "missing_kernel",
    "Exception: sglang-kernel is installed with version 0.4.1, which is less than the minimum "
    "required version 0.4.9. Please reinstall the latest version with `pip install "
    "sglang-kernel --force-reinstall`": "runtime_version",
    "ModuleNotFoundError: No module named 'sgl_kernel'": "import_error",
    "ValueError: Warning: User-specified context_length (16384) is greater than the derived "
    "context_length (8192). This may lead to incorrect model outputs or CUDA errors.": (
        "context_length"
    ),
    "RuntimeError: Cannot find any model weights with `/opt/kimi/canary/checkpoints/x`": (
        "checkpoint"
    ),
    "ValueError: DFLASH target_layer_ids contains an out-of-range layer id. "
    "target_layer_ids[1]=4, target_num_layers=4.": "checkpoint",
    "AssertionError: 500 is not divisible by 8": "checkpoint",
}


@pytest.mark.parametrize(("text", "kind"), TEXTS.items())
def test_each_known_failure_text_is_classified(text, kind):
    noise = ["[2026-01-01 00:00:00] server_args=ServerArgs(model_path='/x')", "loading..."]
    line, entry = first_error([*noise, f"[2026-01-01 00:00:01 TP0] {text}", "later"])
    assert entry is not None and entry["kind"] == kind, (text, entry)
    assert text in line


def test_every_table_entry_is_reached_by_one_of_the_texts():
    reached = {id(known_failure(text)) for text in TEXTS}
    missing = [entry["pattern"] for entry in KNOWN_FAILURES if id(entry) not in reached]
    assert not missing, missing
    # Each entry names where its text comes from.
    assert all(entry["source"] for entry in KNOWN_FAILURES)


def test_an_unknown_failure_is_the_exception_line_of_the_first_traceback():
    lines = [
        "WARNING something mild",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "KeyError: 'language_model.model.layers.0.self_attn.q_a_proj.weight'",
        "Traceback (most recent call last):",
        "ValueError: later",
    ]
    line, entry = first_error(lines)
    assert entry is None
    assert line == "KeyError: 'language_model.model.layers.0.self_attn.q_a_proj.weight'"
    assert first_error(["all", "fine"]) == (None, None)
    syntax = ['  File "x.py", line 2', "SyntaxError: invalid syntax"]
    assert first_error(syntax) == ("SyntaxError: invalid syntax", None)
    assert first_error(["x", "Server failed to bind"]) == ("Server failed to bind", None)


def test_the_backend_hint_names_what_runs_here_and_the_variable_to_set():
    context = {
        "compute_capability": "12.0",
        "capabilities": CAPABILITIES,
        "backends": {"target": "fa3", "draft": "flashinfer", "tree": "triton"},
    }
    entry = known_failure(next(iter(TEXTS)))
    said = hint("attention_backend", entry, context)
    assert "The attention backend fa3 does not run on these GPUs (compute capability 12.0)" in said
    assert "Backends that run here: flashinfer, triton" in said
    assert "Set kimi_target_attention_backend to one of them" in said
    for kind in ("out_of_memory", "missing_kernel", "import_error", "exited", "never_ready"):
        assert hint(kind, None, {"log": "/l", "timeout_s": 9, "exit_code": 1})


def test_source_files_keep_the_small_files_and_drop_weights():
    files = [
        {"path": "config.json", "size": 3000},
        {"path": "tokenizer_config.json", "size": 9000},
        {"path": "tiktoken.model", "size": 2_800_000},
        {"path": "chat_template.jinja", "size": 4000},
        {"path": "modeling_kimi_k25.py", "size": 40000},
        {"path": "model-00001-of-00064.safetensors", "size": 9_000_000_000},
        {"path": "model.safetensors.index.json", "size": 9_000_000},
        {"path": "pytorch_model.bin", "size": 10},
        {"path": "sub/x.pt", "size": 10},
        {"path": "huge.txt", "size": 65 << 20},
        {"path": "nosize.txt", "size": None},
    ]
    kept = [f["path"] for f in source_files(files, 64 << 20)]
    assert kept == [
        "config.json",
        "tokenizer_config.json",
        "tiktoken.model",
        "chat_template.jinja",
        "modeling_kimi_k25.py",
    ]
    with pytest.raises(CanaryError, match="needs a path"):
        source_files([{"size": 1}], 10)


def launch(name="ar", python=sys.executable, **environment) -> dict:
    return {
        "name": name,
        "argv": [python, "-m", "sglang.launch_server", "--model-path", "/m", "--tp-size", "8"],
        "environment": environment,
    }


GPUS = {"uuids": ["GPU-0", "GPU-1"], "driver": "580.1", "compute_capability": "12.0"}


def test_identity_follows_what_decides_the_outcome_and_digests_no_secret(tmp_path):
    checkpoints = {
        "target": {"path": "/m", "digest": "a" * 64},
        "eagle3": {"path": "/e", "digest": "b"},
    }
    base = identity(launch(), checkpoints, GPUS)
    assert identity(launch(), checkpoints, GPUS) == base
    # A checkpoint the argv does not name does not count; one it names does.
    assert (
        identity(launch(), {**checkpoints, "eagle3": {"path": "/e", "digest": "c"}}, GPUS) == base
    )
    changed = {**checkpoints, "target": {"path": "/m", "digest": "d" * 64}}
    assert identity(launch(), changed, GPUS) != base
    assert identity(launch(X="1"), checkpoints, GPUS) != base
    assert identity(launch(), checkpoints, {**GPUS, "driver": "580.2"}) != base
    assert identity(launch(), checkpoints, {**GPUS, "uuids": ["GPU-9"]}) != base
    # A secret's value never reaches the digest: another value, the same identity.
    one = identity(launch(HTTPS_PROXY="http://u:p1@proxy"), checkpoints, GPUS)
    assert identity(launch(HTTPS_PROXY="http://u:p2@proxy"), checkpoints, GPUS) == one
    # The runtime folder the python link points at.
    runtimes = tmp_path / "runtimes"
    for version in ("v1", "v2"):
        (runtimes / version / "bin").mkdir(parents=True)
        (runtimes / version / "bin" / "python").symlink_to(sys.executable)
    venv = tmp_path / "venv"
    venv.symlink_to(runtimes / "v1")
    first = identity(launch(python=str(venv / "bin/python")), checkpoints, GPUS)
    venv.unlink()
    venv.symlink_to(runtimes / "v2")
    assert identity(launch(python=str(venv / "bin/python")), checkpoints, GPUS) != first


def entry(state="ok", **more) -> dict:
    base = skipped("e" * 64, "/l/ar.log", "") | {"state": state, "reason": None}
    if state == "ok":
        base.update(seconds_to_ready=1.0, generate={"completion_tokens": 8, "spec_verify_ct": None},
                    chat={"ok": True})  # fmt: skip
    if state == "failed":
        base.update(failure="exited", hint="h", first_error="x")
    return {**base, **more}


def test_plan_runs_again_what_failed_changed_or_was_never_run(tmp_path):
    record_path = tmp_path / "canary.json"
    configs = [launch("ar"), launch("dflash"), launch("eagle3")]
    identities, to_run = canary.plan(configs, str(record_path), {}, GPUS, False)
    assert to_run == ["ar", "dflash", "eagle3"]
    results = {
        "ar": entry(identity=identities["ar"]),
        "dflash": entry("failed", identity=identities["dflash"]),
        "eagle3": entry(identity="f" * 64),
    }
    record = build_record(None, ["ar", "dflash", "eagle3"], results, {"host": "h"}, {})
    write_record(str(record_path), record, None)
    assert canary.plan(configs, str(record_path), {}, GPUS, False)[1] == ["dflash", "eagle3"]
    assert canary.plan(configs, str(record_path), {}, GPUS, True)[1] == ["ar", "dflash", "eagle3"]
    # A record that is not one (another file, a broken one) vouches for nothing.
    record_path.write_text(json.dumps({"kind": "other"}))
    assert canary.plan(configs, str(record_path), {}, GPUS, False)[1] == ["ar", "dflash", "eagle3"]


def test_the_record_keeps_configs_not_run_drops_others_and_is_written_only_on_change(tmp_path):
    path = str(tmp_path / "canary.json")
    first = build_record(
        None, ["ar", "dflash"], {"ar": entry(), "dflash": entry("failed")}, {"host": "h"}, {}
    )
    assert validate_record(first) == []
    assert (first["passed"], first["failed"], first["skipped"]) == (["ar"], ["dflash"], [])
    _, changed = write_record(path, first, None)
    assert changed and json.loads(Path(path).read_text()) == first
    assert os.stat(path).st_mode & 0o777 == 0o644
    # The same content again: nothing written, the times kept.
    again = build_record(read_record(path), ["ar", "dflash"], {}, {"host": "h"}, {})
    assert write_record(path, again, read_record(path)) == (first, False)
    # ar not run again keeps its entry; dflash passes now; eagle3 of the last run is dropped.
    later = build_record(first, ["ar", "dflash"], {"dflash": entry()}, {"host": "h"}, {})
    assert later["configs"]["ar"] == first["configs"]["ar"] and later["failed"] == []
    with pytest.raises(CanaryError, match="eagle3: no canary result"):
        build_record(first, ["eagle3"], {}, {}, {})


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda r: r.update(kind="x"), "kind/schema_version"),
        (lambda r: r["configs"]["ar"].update(state="great"), "configs.ar.state is 'great'"),
        (lambda r: r["configs"]["ar"].update(identity="abc"), "configs.ar.identity is not"),
        (lambda r: r["configs"]["ar"].update(seconds="1"), "configs.ar.seconds is not a number"),
        (lambda r: r["configs"]["ar"].pop("hint"), "configs.ar has fields"),
        (lambda r: r["configs"]["ar"].update(generate={"completion_tokens": "8"}), "generate"),
        (lambda r: r["configs"]["ar"].update(chat={"ok": "yes"}), "configs.ar.chat"),
        (lambda r: r.update(passed=[]), "passed does not list"),
        (lambda r: r["configs"].update({"Bad Name": entry()}), "is not a serving config name"),
        (lambda r: r["configs"]["ar"].update(state="failed"), "failed without a failure kind"),
    ],
)
def test_a_malformed_record_is_refused(change, error):
    record = build_record(None, ["ar"], {"ar": entry()}, {}, {})
    change(record)
    assert any(error in problem for problem in validate_record(record)), validate_record(record)


# --- real processes -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    """The simulator packaged as sglang (the fake release runtime), and tiny folders."""
    root = tmp_path_factory.mktemp("canary-runtime")
    return {"package": write_package(root / "package"), "folders": tiny_folders(root / "models")}


def spec(runtime, tmp_path, name="ar", timeout=30.0, argv_extra=(), **environment) -> dict:
    from tests.support.sim_process import QUICK_POLLS, quiet_port

    folders = runtime["folders"]
    argv = [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", str(folders["target"]),
        "--trust-remote-code", "--tp-size", "8",
        "--attention-backend", "flashinfer",
        "--served-model-name", "tiny",
        "--host", "127.0.0.1", "--port", "0",
        *argv_extra,
    ]  # fmt: skip
    # Some of these servers load for a minute before they open their port: one that bind(0)
    # could give to another worker's server in the meantime would be judged as theirs.
    port = quiet_port()
    argv[argv.index("--port") + 1] = str(port)
    return {
        "config": {
            "name": name,
            "argv": argv,
            "environment": {
                "PYTHONPATH": str(runtime["package"]),
                "SGLANG_SIM_STEP_MS": "2",
                **QUICK_POLLS,
                **environment,
            },
        },
        "secret_environment": {},
        "identity": "0" * 64,
        "log": str(tmp_path / "logs" / f"{name}.log"),
        "host": "127.0.0.1",
        "port": port,
        "timeout_s": timeout,
        "grace_s": 2,
        "chat_template_kwargs": {"thinking": False},
        "secrets": [API_KEY, HF_TOKEN],
        "capabilities": CAPABILITIES,
        "backends": {"target": "flashinfer"},
        "compute_capability": "12.0",
    }


def run_script(runtime, tmp_path, source: str, timeout: float) -> tuple[dict, float, Path]:
    """A canary of a script standing in for the server: its entry, how long it took, the
    script (whose path marks its processes)."""
    script = tmp_path / "server.py"
    script.write_text(source)
    given = spec(runtime, tmp_path, timeout=timeout)
    given["config"]["argv"] = [sys.executable, str(script), "--port", str(given["port"])]
    started = time.monotonic()
    result = canary.run_one(given)
    return result, time.monotonic() - started, script


def leftovers(marker: str) -> list[str]:
    """Processes still running whose command line holds marker (a test's own folder)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in command and str(os.getpid()) != pid:
            found.append(command)
    return found


def test_a_config_that_serves_passes_with_its_generate_and_chat(runtime, tmp_path):
    dflash = [
        "--speculative-algorithm", "DFLASH",
        "--speculative-draft-model-path", str(runtime["folders"]["dflash"]),
        "--speculative-num-draft-tokens", "8", "--speculative-dflash-block-size", "8",
    ]  # fmt: skip
    result = canary.run_one(spec(runtime, tmp_path, "dflash", argv_extra=dflash))
    assert result["state"] == "ok", result
    assert result["failure"] is result["first_error"] is result["hint"] is None
    assert 0 < result["seconds_to_ready"] <= result["seconds"] < 30
    assert result["generate"]["completion_tokens"] == 8
    assert result["generate"]["spec_verify_ct"] >= 1 and result["chat"] == {"ok": True}
    log = Path(result["log"])
    assert log.stat().st_mode & 0o777 == 0o600 and log.parent.stat().st_mode & 0o777 == 0o700
    assert "serving on 127.0.0.1" in log.read_text()
    assert not leftovers(str(runtime["folders"]["dflash"])), "the canary left a process behind"


def test_a_server_that_never_opens_its_port_is_stopped_at_the_deadline(runtime, tmp_path):
    started = time.monotonic()
    result = canary.run_one(spec(runtime, tmp_path, timeout=3, SGLANG_SIM_LOAD_SECONDS="60"))
    assert time.monotonic() - started < 15
    assert (result["state"], result["failure"]) == ("failed", "never_ready"), result
    assert result["reason"] == "the port never opened"
    assert "No answer from /health_generate within 3" in result["hint"]
    assert not leftovers(result["log"].rsplit("/", 2)[0]) and not leftovers("LOAD_SECONDS")


HANGING = """
import http.server, sys, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def do_POST(self):
        time.sleep(3600)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[-1])), H).serve_forever()
"""


def test_a_server_that_hangs_on_generate_fails_within_the_deadline(runtime, tmp_path):
    """Healthy, then /generate never answers: the request is cut at what is left of the
    deadline and the process group killed."""
    result, seconds, hanging = run_script(runtime, tmp_path, HANGING, timeout=4)
    assert seconds < 15
    assert (result["state"], result["failure"]) == ("failed", "not_generating"), result
    assert result["reason"].startswith("/generate: POST /generate: no whole answer within")
    assert result["seconds_to_ready"] is not None
    assert not leftovers(str(hanging))


def test_a_crash_at_start_is_exited_with_its_status(runtime, tmp_path):
    result = canary.run_one(spec(runtime, tmp_path, SGLANG_SIM_CRASH_ON_START="1"))
    assert (result["state"], result["failure"]) == ("failed", "exited"), result
    assert result["reason"] == "exit status 1"
    assert result["first_error"] is None or "crash" in result["first_error"]
    assert "exited (status 1)" in result["hint"]


def test_a_model_that_loads_but_never_generates_is_not_generating(runtime, tmp_path):
    result = canary.run_one(spec(runtime, tmp_path, timeout=6, SGLANG_SIM_NO_GENERATE="1"))
    assert (result["state"], result["failure"]) == ("failed", "not_generating"), result
    assert result["seconds_to_ready"] is None and result["generate"] is None


def test_a_busy_port_fails_before_anything_starts(runtime, tmp_path):
    import socket

    given = spec(runtime, tmp_path)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", given["port"]))
        holder.listen()
        result = canary.run_one(given)
    assert (result["state"], result["failure"]) == ("failed", "port_in_use"), result
    assert not Path(given["log"]).exists()


def test_secrets_in_the_log_never_reach_the_record(runtime, tmp_path):
    """A config whose failure line carries the API key and the HF token (as SGLang's own lines
    can: it logs its ServerArgs, api_key included): neither, nor any unkeyed hash or base64 of
    them, is in the entry or the record written from it."""
    source = (
        "import sys\n"
        f"print(\"server_args=ServerArgs(api_key='{API_KEY}', hf='{HF_TOKEN}')\", flush=True)\n"
        "print('Traceback (most recent call last):')\n"
        f"print('ValueError: cannot use {API_KEY} with token {HF_TOKEN} "
        f"Authorization: Bearer {API_KEY}')\n"
        "sys.exit(3)\n"
    )
    result, _, _ = run_script(runtime, tmp_path, source, timeout=30)
    assert result["failure"] == "exited" and result["first_error"].startswith("ValueError: cannot")
    record = build_record(None, ["ar"], {"ar": result}, {"host": "h"}, {})
    path = tmp_path / "canary.json"
    write_record(str(path), record, None)
    written = path.read_bytes() + json.dumps(result).encode()
    for secret in (API_KEY, HF_TOKEN):
        for form, value in derived_forms(secret).items():
            assert value not in written, form
    # The log itself keeps what the server wrote, in its root-only file.
    assert API_KEY in Path(result["log"]).read_text()


STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
subprocess.Popen([sys.executable, "-c", child, "stubborn-child"])
time.sleep(600)
"""


def test_a_server_that_ignores_sigterm_is_killed_with_its_children_after_the_grace(
    runtime, tmp_path
):
    result, seconds, stubborn = run_script(runtime, tmp_path, STUBBORN, timeout=2)
    assert (result["state"], result["failure"]) == ("failed", "never_ready"), result
    # The deadline, the grace (2 s), then SIGKILL to the whole group.
    assert seconds < 2 + 2 + 6
    time.sleep(0.5)
    assert not leftovers(str(stubborn)) and not leftovers("stubborn-child")


# --- the module ---------------------------------------------------------------------------


def test_the_module_plans_records_and_sees_the_running_server(tmp_path, monkeypatch):
    """canary_serve as the role calls it: plan (identities from nvidia-smi's GPUs, the kit's
    supervised server seen running), run with a skip reason, record; a second record of the
    same outcome writes nothing; the launches filter keeps secrets apart."""
    from tests.support.modules import load_filters, run_module

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho 'GPU-00000000-0000-0000-0000-000000000000, 580.159.04, 12.0'\n"
        "echo 'GPU-00000000-0000-0000-0000-000000000001, 580.159.04, 12.0'\n"
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    # A supervisor that runs: this process stands in for it.
    pid_file, state_file = tmp_path / "kimi-sglang.pid", tmp_path / "kimi-sglang.state.json"
    pid_file.write_text(str(os.getpid()))
    state_file.write_text(json.dumps({"supervisor_pid": os.getpid(), "status": "running"}))
    rendered = [
        {**launch("ar"), "base": "ar", "runtime_kind": "release", "tp_size": 8},
        {**launch("dflash", HTTPS_PROXY="http://u:pw@proxy"), "base": "dflash",
         "runtime_kind": "release", "tp_size": 8},
    ]  # fmt: skip
    split = load_filters().kimi_canary_launches(rendered, {"ar": {"SGLANG_SIM_X": "1"}})
    launches = split["launches"]
    assert launches[0]["environment"] == {"SGLANG_SIM_X": "1"}
    assert launches[1]["environment"] == {"HTTPS_PROXY": "********"}
    assert split["secret_environment"] == {"ar": {}, "dflash": {"HTTPS_PROXY": "http://u:pw@proxy"}}
    record = str(tmp_path / "canary.json")
    server = {"manager": "supervisor", "name": "kimi-sglang", "pid_file": str(pid_file),
              "state_file": str(state_file)}  # fmt: skip
    planned = run_module(
        "canary_serve", {"action": "plan", "record": record, "configs": launches, "server": server}
    )
    assert not planned.get("failed"), planned
    assert planned["to_run"] == ["ar", "dflash"] and planned["server_active"] is True
    assert planned["gpus"] == {"count": 2, "driver": "580.159.04", "compute_capability": "12.0"}
    entries = {}
    for config in launches:
        ran = run_module(
            "canary_serve",
            {
                "action": "run",
                "record": record,
                "config": config,
                "identity": planned["identities"][config["name"]],
                "log_dir": str(tmp_path / "logs"),
                "skip_reason": "the kit's server (kimi-sglang, running) holds the GPUs",
            },
        )
        assert ran["changed"] is False and ran["entry"]["state"] == "skipped", ran
        entries[config["name"]] = ran["entry"]
    facts = {"host": "h", "profile": "ct200", "model": "kimi-k2.6"}
    args = {"action": "record", "record": record, "names": ["ar", "dflash"], "results": entries,
            "facts": facts}  # fmt: skip
    written = run_module("canary_serve", args)
    assert written["changed"] is True and written["canary"]["skipped"] == ["ar", "dflash"]
    assert written["summary"]["lines"][1].startswith("ar: skipped: the kit's server")
    assert run_module("canary_serve", {**args, "results": {}})["changed"] is False
    assert "pw@proxy" not in Path(record).read_text()
    # Skipped is not passed: the next plan runs both again.
    assert run_module("canary_serve", {"action": "plan", "record": record, "configs": launches})[
        "to_run"
    ] == ["ar", "dflash"]
