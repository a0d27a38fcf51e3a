"""The preflight stage over SSH test hosts: a healthy host passes, each fault has its message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.hub_server import LocalHub, add_kimi_repos, token_env

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.preflight, pytest.mark.integration]

GOOD = "hf_tests_good_7d1c3e9a"  # approved for the gated drafter
UNAPPROVED = "hf_tests_unapproved_51b2"  # a valid account without access
BAD = "hf_tests_not_a_token_0c4f"  # rejected by the hub
PREFLIGHT = "playbooks/preflight.yml"
JUDGE = "Judge every check"


@pytest.fixture(scope="module")
def hub():
    with LocalHub() as hub:
        hub.valid_tokens |= {GOOD, UNAPPROVED}
        add_kimi_repos(hub, {GOOD})
        yield hub


@pytest.fixture(scope="module")
def hosts(hub):
    from tests.support.testhosts import TestHostCluster

    names = [
        "ct200-ok",
        "h200-fewgpus",
        "ct200-wrongmodel",
        "ct200-fa3",
        "ct200-lowdisk",
        "ct200-nofit",
        "b200-ok",
    ]
    profiles = ["ct200", "h200", "ct200", "ct200", "ct200", "ct200", "b200"]
    cluster = TestHostCluster.up(profiles, names=names, captures={"ct200-wrongmodel": "b200-x8"})
    try:
        cluster.write_inventory(
            host_vars={
                "ct200-fa3": {"kimi_target_attention_backend": "fa3"},
                "ct200-nofit": {"kimi_mem_fraction_static": 0.6},
                # Longer than one drafted request can use of CT200's KV pool (about 82K).
                "ct200-ok": {"kimi_context_length": 200000},
            }
        )
        # A weights filesystem of 1 MiB: smaller than what the hub lists.
        cluster.ssh(
            "ct200-lowdisk", "mkdir -p /opt/kimi && mount -t tmpfs -o size=1m tmpfs /opt/kimi"
        )
        # A fabric manager process, as the real one runs where systemd is not PID 1.
        cluster.ssh(
            "b200-ok",
            "cp /bin/sleep /usr/local/bin/nv-fabricmanager; "
            "setsid /usr/local/bin/nv-fabricmanager 900 >/dev/null 2>&1 < /dev/null &",
        )
        yield cluster
    finally:
        cluster.down()


def preflight(playbook, hosts, hub, token, secrets_dir, limit=None):
    return playbook(
        PREFLIGHT,
        hosts.inventory,
        envvars={
            "HF_ENDPOINT": hub.url,
            "HF_HUB_DISABLE_XET": "1",
            **token_env(token, secrets_dir),
        },
        limit=limit,
    )


def failure(run, host: str) -> str:
    result = run.results(JUDGE)[host]
    assert result.get("failed"), f"{host} passed preflight: {result}"
    return result["msg"]


@pytest.fixture(scope="module")
def full_run(hosts, hub, tmp_path_factory):
    from tests.support.ansible_run import run_playbook

    private = tmp_path_factory.mktemp("preflight-all")
    secrets = tmp_path_factory.mktemp("secrets")
    run = run_playbook(
        PREFLIGHT,
        hosts.inventory,
        private,
        extravars={
            "preflight_context_lengths_file": (
                f"{private}/context/{{{{ inventory_hostname }}}}.json"
            ),
            "preflight_controller_record_file": (
                f"{private}/records/{{{{ inventory_hostname }}}}/preflight.json"
            ),
        },
        envvars={"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", **token_env(GOOD, secrets)},
    )
    run.context_dir = private / "context"
    run.records_dir = private / "records"
    return run


def test_healthy_hosts_pass(full_run):
    judged = full_run.results(JUDGE)
    assert {"ct200-ok", "b200-ok"} <= set(judged), full_run.stdout
    for host in ("ct200-ok", "b200-ok"):
        assert not judged[host].get("failed"), judged[host].get("msg")
        assert judged[host]["failures"] == []
    # ACS cannot be read on a namespace host: reported, not fatal (warn-only by default).
    assert any("[acs]" in w for w in judged["ct200-ok"]["warning_messages"])
    revisions = full_run.results("Record the commits the revisions resolved to")["ct200-ok"]
    resolved = revisions["ansible_facts"]["preflight_resolved_revisions"]
    assert set(resolved) == {"target", "dflash", "eagle3"}
    assert all(len(sha) == 40 for sha in resolved.values())


def test_the_verdict_and_compute_capability_are_recorded_passed_or_not(full_run, hosts):
    """preflight.json on the host (for the support bundle) and on the controller, for a host
    that passed and one that failed: the GPUs' compute capability, every check's verdict."""
    for host, passed, capability in (
        ("ct200-ok", True, "12.0"),
        ("b200-ok", True, "10.0"),
        ("ct200-fa3", False, "12.0"),
    ):
        on_host = json.loads(hosts.ssh(host, "cat /var/lib/kimi/preflight.json").stdout)
        on_controller = json.loads((full_run.records_dir / host / "preflight.json").read_text())
        assert on_host == on_controller
        assert on_host["kind"] == "kimi.preflight" and on_host["passed"] is passed, on_host
        assert on_host["compute_capability"] == capability
        assert {d["compute_capability"] for d in on_host["gpus"]["devices"]} == {capability}
        assert len(on_host["gpus"]["devices"]) == on_host["gpus"]["count"] == 8
        assert {f["check"] for f in on_host["findings"]} >= {"gpu_count", "compute_capability"}
        # The weights folder's free space, which plan.md turns into the disk a download leaves.
        disk = on_host["disk"]
        assert disk["path"] == "/opt/kimi/weights" and disk["free_bytes"] > 0
        assert disk["recorded_at"].startswith("20")
    failed = json.loads((full_run.records_dir / "ct200-fa3" / "preflight.json").read_text())
    assert any("fa3 does not run on compute capability 12.0" in m for m in failed["failures"])
    facts = full_run.results("Keep the GPUs' compute capability as a fact")["ct200-ok"]
    assert facts["ansible_facts"]["preflight_compute_capability"] == "12.0"


def test_too_few_gpus(full_run):
    message = failure(full_run, "h200-fewgpus")
    assert "found 2 GPUs (NVIDIA H200 x2); needed at least 8 for tp_size 8" in message
    assert "lower kimi_tp_size" in message
    assert "nvidia-fabricmanager is not running" in message


def test_wrong_gpu_model(full_run):
    message = failure(full_run, "ct200-wrongmodel")
    assert "found NVIDIA B200 x8; the ct200 profile needs NVIDIA RTX PRO 6000" in message


def test_unsupported_architecture(full_run):
    message = failure(full_run, "ct200-fa3")
    assert "target attention backend fa3 does not run on compute capability 12.0" in message
    assert "flashinfer, triton" in message


def test_low_disk(full_run):
    message = failure(full_run, "ct200-lowdisk")
    assert "[disk] free space for /opt/kimi/weights" in message
    assert "still to download" in message and "headroom" in message


def test_does_not_fit(full_run):
    message = failure(full_run, "ct200-nofit")
    assert "[capacity] serving config ar does not fit" in message
    assert "weights need 71.8 GiB per GPU" in message


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("", "no Hugging Face token, while the serving configs need the gated"),
        (UNAPPROVED, "is gated and the token's account has no approved access"),
        (BAD, "the Hugging Face token was rejected as invalid"),
    ],
    ids=["missing-token", "gated-without-access", "invalid-token"],
)
def test_token_problems(playbook, hosts, hub, token, expected, tmp_path_factory):
    """Stopped by the settings check, before preflight connects to the host."""
    run = preflight(
        playbook, hosts, hub, token, tmp_path_factory.mktemp("secrets"), limit="ct200-ok"
    )
    message = run.results("Stop before connecting when a setting is wrong")["ct200-ok"]["msg"]
    assert expected in message
    assert not run.results("Gather GPU facts") and not run.results("Take the per-host lock")
    assert "z-lab/Kimi-K2.6-DFlash" in message
    if token:
        assert token not in run.stdout
        assert not any(token in str(event) for event in run.events)


def test_token_never_reaches_output_or_files(full_run):
    assert GOOD not in full_run.stdout
    assert not any(GOOD in str(event) for event in full_run.events)
    # Everything ansible-runner wrote: events, artifacts, the recorded command and env.
    for written in full_run.private_dir.rglob("*"):
        if written.is_file():
            assert GOOD not in written.read_text(errors="replace"), f"token in {written}"


def test_check_mode_runs_the_same_checks(playbook, hosts, hub, tmp_path):
    run = playbook(
        PREFLIGHT,
        hosts.inventory,
        envvars={"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", **token_env(GOOD, tmp_path)},
        limit="ct200-ok",
        check=True,
    )
    run.assert_unchanged()


def test_context_length_is_recorded_per_launch_and_warned_when_it_outruns_the_pool(full_run):
    """auto (b200-ok): each launch's figure from the host's own GPUs, recorded for the server
    stage; a user's 200000 on CT200 (ct200-ok) is kept, with a warning per drafted config."""
    record = json.loads((full_run.context_dir / "b200-ok.json").read_text())
    assert record["kind"] == "kimi.context_lengths" and record["context_length"] == "auto"
    lengths, pools = record["context_lengths"], record["kv_tokens"]
    assert {"ar", "dflash", "eagle3", "ddtree-b16"} <= set(lengths)
    assert all(lengths[name] == min(pools[name], 262144) for name in lengths)
    ct200 = json.loads((full_run.context_dir / "ct200-ok.json").read_text())
    assert set(ct200["context_lengths"].values()) == {200000}
    assert 80_000 < ct200["kv_tokens"]["dflash"] < 86_000
    warnings = full_run.results(JUDGE)["ct200-ok"]["warning_messages"]
    outrun = [w for w in warnings if w.startswith("[context_length]")]
    assert any("serving config dflash:" in w and "200000" in w for w in outrun), warnings
    assert not any(
        "[context_length]" in w for w in full_run.results(JUDGE)["b200-ok"]["warning_messages"]
    )
