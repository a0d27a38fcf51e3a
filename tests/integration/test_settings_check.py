"""Every mistake of a new user's first hour stops on the controller, before any connection:
each run below has an ssh that records that it was called (and fails), and each mistake must
leave it uncalled while its message says what was found, what is needed and the fix.
A correct inventory is the control: there the same ssh is called."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK_TASK = "Stop before connecting when a setting is wrong"
PROFILE_LINKS = ("all", "ct200.yml", "h200.yml", "b200.yml", "b300.yml")


def lab(tmp_path: Path, group: str = "ct200", host_vars: str = "", group_vars: str = "") -> Path:
    """An inventory copy as README's quick start makes one, its host's ssh the recorder."""
    inventory = tmp_path / "lab"
    (inventory / "group_vars").mkdir(parents=True)
    for name in PROFILE_LINKS:
        (inventory / "group_vars" / name).symlink_to(REPO / "group_vars" / name)
    (inventory / "group_vars" / "gpu_hosts.yml").write_text("---\n" + group_vars)
    ssh = tmp_path / "ssh"
    ssh.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "ssh-called"}\nexit 255\n')
    ssh.chmod(0o755)
    (inventory / "hosts.yml").write_text(
        "all:\n  children:\n    gpu_hosts:\n      children:\n"
        f"        {group}:\n          hosts:\n            node-01:\n"
        f"              ansible_host: 127.0.0.1\n              ansible_ssh_executable: {ssh}\n"
    )
    if host_vars:
        (inventory / "host_vars").mkdir()
        (inventory / "host_vars" / "node-01.yml").write_text("---\n" + host_vars)
    return inventory


def run(tmp_path: Path, playbook: str, inventory: Path, *args: str, cwd: Path = REPO, token=True):
    token_file = tmp_path / "hf-token"
    if token:
        token_file.write_text("hf_SettingsCheckToken0123456789abcdef")
        token_file.chmod(0o600)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")},
        "HF_TOKEN": "",
        "HF_TOKEN_PATH": str(token_file),
        # A closed port here: the deploy's settings check asks the hub about the token, and no
        # traffic leaves this machine (a hub that does not answer is not the token's fault).
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "ANSIBLE_NOCOLOR": "1",
    }
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), str(REPO / playbook)]
    argv += ["-i", str(inventory), "-e", f"kimi_lock_file={tmp_path / 'kimi.lock.yml'}"]
    argv += ["-e", f"plan_output_dir={tmp_path / 'plan'}", *args]
    done = subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stdout + done.stderr


def stopped_before_ssh(tmp_path: Path, rc: int, out: str, *expected: str, once=True) -> None:
    """once: the kit's callback prints each failure once; outside the repository root Ansible's
    default one is loaded, which prints it twice."""
    assert rc != 0, out[-3000:]
    assert CHECK_TASK in out, out[-3000:]
    assert not (tmp_path / "ssh-called").exists(), "ssh was called before the settings check"
    flat = " ".join(out.split())
    for text in expected:
        assert text in flat, (text, out[-3000:])
    # found, needed, fix, once each problem, and the message printed once
    assert flat.count("Needed:") == flat.count("Fix:") >= 1
    if once:
        assert flat.count(expected[0]) == 1, out[-3000:]


# Each mistake of the issue with what its line must say. The check reports every problem of
# a run at once, each on its own: one run holds them all (the profile group is its own run,
# since without a profile no option can be worked out).
MISTAKES = {
    "misspelt in host_vars": [
        "Found: kimi_weigths_dir (",
        "host_vars/node-01.yml:2), a name with the kit's prefix",
        "Fix: rename it to kimi_weights_dir",
    ],
    "misspelt in group_vars": [
        "Found: benchmark_concurency (",
        "Fix: rename it to benchmark_concurrency",
    ],
    "a negative budget": [
        "benchmark_ddtree_budgets is [16, -8]",
        "item -8 is not",
        "a list of integers from 1 to 4096",
    ],
    "a list as text on the command line": [
        "benchmark_concurrency is '1,4,16' (-e): text, not a list",
        """-e '{"benchmark_concurrency": [1, 4, 16]}'""",
    ],
    "a memory fraction of 1": [
        "preflight_mem_fraction_static is 1.0",
        "from kimi_mem_fraction_static (",
        "host_vars/node-01.yml:3)",
        "a number above 0 and below 1",
    ],
}


@pytest.mark.parametrize(
    "playbook", ["deploy_kimi.yml", "benchmark_kimi.yml", "teardown.yml", "diagnose.yml"]
)
def test_every_playbook_that_acts_on_hosts_checks_before_it_connects(tmp_path, playbook):
    inventory = lab(tmp_path, host_vars="kimi_weigths_dir: /data/weights\n")
    rc, out = run(tmp_path, playbook, inventory)
    stopped_before_ssh(
        tmp_path, rc, out, "Found: kimi_weigths_dir", "rename it to kimi_weights_dir"
    )


def test_each_first_hour_mistake_stops_the_deploy_before_ssh(tmp_path):
    inventory = lab(
        tmp_path / "inv",
        host_vars="kimi_weigths_dir: /data/weights\nkimi_mem_fraction_static: 1.0\n",
        group_vars="benchmark_concurency: [1, 2]\nbenchmark_ddtree_budgets: [16, -8]\n",
    )
    rc, out = run(tmp_path, "deploy_kimi.yml", inventory, "-e", "benchmark_concurrency=1,4,16")
    assert "5 setting(s) to fix before this run connects to any host" in out, out[-3000:]
    for expected in MISTAKES.values():
        stopped_before_ssh(tmp_path / "inv", rc, out, *expected)


def test_an_unknown_profile_group_stops_the_deploy_before_ssh(tmp_path):
    rc, out = run(tmp_path, "deploy_kimi.yml", lab(tmp_path / "inv", group="h100"))
    stopped_before_ssh(
        tmp_path / "inv",
        rc,
        out,
        "none of the hardware profile groups (its groups: gpu_hosts, h100)",
        "ct200, h200, b200, b300",
    )


def test_no_token_for_the_gated_drafter_stops_deploy_and_plan(tmp_path):
    inventory = lab(tmp_path)
    for playbook in ("deploy_kimi.yml", "plan.yml"):
        rc, out = run(tmp_path, playbook, inventory, token=False)
        stopped_before_ssh(
            tmp_path,
            rc,
            out,
            "Found: no Hugging Face token, while the serving configs need the gated "
            "z-lab/Kimi-K2.6-DFlash (dflash)",
            "export HF_TOKEN",
        )
    # Without the configs that need it, no token is asked for.
    rc, out = run(
        tmp_path,
        "plan.yml",
        inventory,
        "-e",
        '{"kimi_serving_configs": ["ar", "eagle3"]}',
        "-e",
        "plan_check_hub=false",
        token=False,
    )
    assert rc == 0, out[-3000:]
    assert "setting(s) to fix" not in out


def test_plan_stops_on_an_unknown_profile_group_too(tmp_path):
    """plan.yml never connects; before this check it failed on `'kimi_profile' is undefined`."""
    rc, out = run(tmp_path, "plan.yml", lab(tmp_path, group="h100"), "-e", "plan_check_hub=false")
    stopped_before_ssh(tmp_path, rc, out, "none of the hardware profile groups (its groups: ")
    assert "is undefined" not in out


def test_a_run_from_a_subdirectory_says_where_to_run_it(tmp_path):
    inventory = lab(tmp_path)
    for playbook in ("plan.yml", "deploy_kimi.yml"):
        rc, out = run(tmp_path, playbook, inventory, cwd=REPO / "inventory")
        stopped_before_ssh(
            tmp_path, rc, out, "where it read no ansible.cfg", f"cd {REPO}", once=False
        )


def test_a_correct_inventory_passes_the_check_and_then_connects(tmp_path):
    """The control: the same recorder is called once the settings are right."""
    rc, out = run(tmp_path, "deploy_kimi.yml", lab(tmp_path))
    assert rc != 0
    assert (tmp_path / "ssh-called").exists(), out[-3000:]
    assert "setting(s) to fix" not in out
