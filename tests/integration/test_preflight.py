"""The preflight stage over SSH test hosts: a healthy host passes, each fault has its message."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.hub_server import LocalHub, token_env

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
        shards = {f"model-{i:05d}-of-00004.safetensors": bytes([i]) * 300_000 for i in range(4)}
        hub.add_repo(
            "moonshotai/Kimi-K2.6",
            {"config.json": (REPO / "models/kimi-k2.6/config.json").read_bytes(), **shards},
        )
        hub.add_repo(
            "z-lab/Kimi-K2.6-DFlash",
            {"config.json": b"{}", "model.safetensors": b"d" * 200_000},
            gated=True,
            approved_tokens={GOOD},
        )
        hub.add_repo(
            "lightseekorg/kimi-k2.6-eagle3.1-mla",
            {"config.json": b"{}", "model.safetensors": b"e" * 100_000},
        )
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
    return run_playbook(
        PREFLIGHT,
        hosts.inventory,
        private,
        envvars={"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", **token_env(GOOD, secrets)},
    )


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
        ("", "is gated and no Hugging Face token was given"),
        (UNAPPROVED, "is gated and the token's account has no approved access"),
        (BAD, "the Hugging Face token was rejected as invalid"),
    ],
    ids=["missing-token", "gated-without-access", "invalid-token"],
)
def test_token_problems(playbook, hosts, hub, token, expected, tmp_path_factory):
    run = preflight(
        playbook, hosts, hub, token, tmp_path_factory.mktemp("secrets"), limit="ct200-ok"
    )
    message = failure(run, "ct200-ok")
    assert expected in message
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
