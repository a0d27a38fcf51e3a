"""tests/benchmarks/suite_cpu.py: acct v3 records read back and each process sorted by kind."""

from __future__ import annotations

import pytest

from tests.benchmarks import suite_cpu

T0 = 1_800_000_000


def record(pid, ppid, command, user=10, system=0, start=0, ticks=1000, faults=0, version=3):
    """One acct v3 record: CPU in ticks (1/100 s), under 8192 so comp_t holds it as is."""
    return suite_cpu.RECORD.pack(
        0, version, 0, 0, 0, 0, pid, ppid, T0 + start, float(ticks),
        user, system, 0, 0, 0, faults, 0, 0, command.encode(),
    )  # fmt: skip


# pid, ppid, command, start (s): a make test in miniature, pids as the kernel hands them out.
TREE = [
    (1, 0, "make", 0),
    (2, 1, "pytest", 0),
    (3, 2, "[pytest-xdist i", 0),
    (4, 3, "ansible-playboo", 1),
    (5, 4, "ansible-playboo", 2),
    (6, 5, "ssh", 2),
    (7, 3, "unshare", 0),
    (8, 7, "sshd", 0),
    (9, 8, "sshd", 1),
    (10, 9, "sh", 2),
    (11, 10, "python3", 2),
    (12, 9, "sudo", 3),
    (13, 12, "sh", 3),
    (14, 13, "python3", 3),
    (15, 11, "python", 2),
    (16, 11, "pip3", 2),
    (17, 11, "nvidia-smi", 2),
    (18, 3, "python", 4),
    (19, 1, "ansible-lint", 0),
    (20, 19, "ansible-playboo", 1),
    (21, 1, "bash", 0),
    (22, 21, "python", 0),
    (23, 9, "bash", 5),
]
KIND_OF = {
    4: "ansible-playbook: each run's process",
    5: "ansible-playbook: task workers",
    6: "under ansible-playbook (local modules, ssh)",
    11: "test hosts: module runs",
    14: "test hosts: module runs",
    15: "test hosts: other Python (simulators, probes, venvs)",
    16: "test hosts: pip",
    17: "test hosts: fake nvidia-smi",
    3: "pytest workers",
    18: "started by the pytest workers",
    19: "lint",
    20: "lint",
    22: "other (make setup, make, the shell)",
    23: "test hosts: other",
}


def write(tmp_path, records) -> object:
    path = tmp_path / "suite.acct"
    path.write_bytes(b"".join(records))
    return path


def test_every_process_is_sorted_by_its_command_and_ancestors(tmp_path):
    # pid 5 comes round again 100 s later as an unrelated process started by make: the
    # parent is the one alive when the child started, not the first with that pid.
    records = [record(pid, ppid, name, start=start) for pid, ppid, name, start in TREE]
    records.append(record(5, 1, "bash", start=100, ticks=100))
    records.append(record(24, 5, "python", start=101, ticks=50))
    processes = suite_cpu.read(write(tmp_path, records))
    tree = suite_cpu.Tree(processes)
    found = {p.pid: suite_cpu.kind(p, tree.ancestors(p)) for p in processes[: len(TREE)]}
    assert {pid: found[pid] for pid in KIND_OF} == KIND_OF
    assert suite_cpu.kind(processes[-1], tree.ancestors(processes[-1])) == (
        "other (make setup, make, the shell)"
    )
    totals = suite_cpu.summary(processes)
    assert totals["test hosts: module runs"]["processes"] == 2
    assert totals["test hosts: module runs"]["cpu"] == pytest.approx(0.2)
    assert sum(entry["processes"] for entry in totals.values()) == len(records)


def test_cpu_and_faults_are_decoded_from_comp_t(tmp_path):
    # comp_t: 13 bits of mantissa, a base-8 exponent above them; 0x2000 | 5 is 5 x 8 ticks.
    processes = suite_cpu.read(
        write(tmp_path, [record(1, 0, "python3", user=0x2000 | 5, system=3, faults=0x4000 | 7)])
    )
    assert processes[0].user == pytest.approx(0.40)
    assert processes[0].system == pytest.approx(0.03)
    assert processes[0].minor_faults == 7 * 64
    assert processes[0].elapsed == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (record(1, 0, "sh")[:-3], "not a whole number of acct v3 records"),
        (record(1, 0, "sh", version=2), "is not acct v3"),
    ],
    ids=["cut-short", "version-2"],
)
def test_a_file_that_is_not_acct_v3_is_refused(tmp_path, data, said):
    with pytest.raises(SystemExit, match=said):
        suite_cpu.read(write(tmp_path, [data]))


def test_a_file_larger_than_a_run_is_refused_and_an_impossible_elapsed_time_is_none(
    tmp_path, monkeypatch
):
    path = write(tmp_path, [record(1, 0, "sh", ticks=float("nan")), record(2, 0, "sh", ticks=-5)])
    assert [p.elapsed for p in suite_cpu.read(path)] == [0.0, 0.0]
    monkeypatch.setattr(suite_cpu, "MAX_BYTES", suite_cpu.RECORD.size)
    with pytest.raises(SystemExit, match="more than a make test's records"):
        suite_cpu.read(path)


def test_the_report_gives_each_kind_and_the_costliest_commands(tmp_path, capsys):
    records = [record(pid, ppid, name, start=start) for pid, ppid, name, start in TREE]
    assert suite_cpu.main([str(write(tmp_path, records)), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{len(TREE)} processes, 2 CPU-s charged to them")
    assert "   0.2   8.7%         2       0.100    0%           0  test hosts: module runs" in out
    assert "the 3 commands with the most CPU:" in out
