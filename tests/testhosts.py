"""SSH test hosts in Linux network namespaces, for running the playbooks for real.

Each host is a network namespace on a private bridge with its own address, its own
hostname (UTS namespace), its own process tree (PID namespace, sshd as PID 1) and its own
mount namespace in which /etc, /opt, /var,
/usr/local, /root and /srv are copy-on-write overlays and /tmp, /run and /dev/shm are
private: whatever a role writes stays on that host. Its sshd takes keys only. A fake
`nvidia-smi` on its PATH replays a GPU capture from tests/fixtures/gpu-hosts/.

Every run is recorded under RUNS_ROOT so that a later `down --stale` removes what an
interrupted run left behind (namespaces, processes, bridge, files).

    python -m tests.testhosts up --profiles ct200,h200,b200   # prints the inventory path
    python -m tests.testhosts down --state-dir DIR
    python -m tests.testhosts down --stale | --all
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "gpu-hosts"
FAKE_NVIDIA_SMI = REPO / "tests" / "fakes" / "nvidia_smi.py"
RUNS_ROOT = Path(os.environ.get("KIMI_TESTHOSTS_ROOT", "/tmp/kimi-kit-testhosts"))
PREFIX = "kkt"  # namespaces, links and run folders all start with it
SUBNET_BASE = "10.213"  # 10.213.<slot>.0/24 per run; private range, never routed off the machine
OVERLAID = ("etc", "opt", "var", "usr/local", "root", "srv")
# Capture replayed by each profile's hosts. h200-x2 is a real capture; the others are built.
PROFILE_CAPTURES = {"ct200": "ct200-x8", "h200": "h200-x2", "b200": "b200-x8"}
SSHD = "/usr/sbin/sshd"


class TestHostError(RuntimeError):
    pass


def run(cmd: list[str], check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if check and result.returncode != 0:
        raise TestHostError(
            f"{' '.join(cmd)} failed ({result.returncode}): {result.stderr.strip()}"
        )
    return result


def process_start_time(pid: int) -> int | None:
    """Start time of a process in clock ticks, to tell a live owner from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


@dataclass
class TestHost:
    name: str
    profile: str
    capture: str
    address: str
    netns: str
    veth: str
    state_dir: str
    sshd_pid: int = 0

    def ssh_command(self, cluster: TestHostCluster, command: str) -> list[str]:
        return [
            "ssh",
            *cluster.ssh_options(),
            f"root@{self.address}",
            command,
        ]


@dataclass
class TestHostCluster:
    run_id: str
    state_dir: str
    bridge: str
    subnet: str
    gateway: str
    owner_pid: int = 0
    owner_start: int | None = None
    hosts: list[TestHost] = field(default_factory=list)

    # -- paths ---------------------------------------------------------------------
    @property
    def root(self) -> Path:
        return Path(self.state_dir)

    @property
    def key_file(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def inventory_dir(self) -> Path:
        return self.root / "inventory"

    @property
    def inventory(self) -> Path:
        return self.inventory_dir / "hosts.yml"

    def ssh_options(self) -> list[str]:
        return [
            "-i",
            str(self.key_file),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
        ]

    def host(self, name: str) -> TestHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    def ssh(
        self,
        host: TestHost | str,
        command: str,
        check: bool = True,
        timeout: float = 60,
        input: str | None = None,
    ):
        if isinstance(host, str):
            host = self.host(host)
        return run(host.ssh_command(self, command), check=check, timeout=timeout, input=input)

    def save(self) -> None:
        (self.root / "state.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, state_dir: Path) -> TestHostCluster:
        data = json.loads((state_dir / "state.json").read_text())
        data["hosts"] = [TestHost(**h) for h in data["hosts"]]
        return cls(**data)

    def owner_alive(self) -> bool:
        if not self.owner_pid:
            return True  # started from the command line: kept until `down`
        return process_start_time(self.owner_pid) == self.owner_start

    # -- bring up ------------------------------------------------------------------
    @classmethod
    def up(
        cls,
        profiles: list[str],
        names: list[str] | None = None,
        captures: dict[str, str] | None = None,
        owner_pid: int | None = None,
    ) -> TestHostCluster:
        """Start one host per profile. owner_pid=0 keeps them after this process exits."""
        check_prerequisites()
        if len(profiles) > 200:
            raise TestHostError("at most 200 test hosts per run")
        run_id = secrets.token_hex(2)
        slot = free_subnet_slot()
        state = RUNS_ROOT / f"{PREFIX}-{run_id}"
        state.mkdir(parents=True, mode=0o700)
        owner = os.getpid() if owner_pid is None else owner_pid
        cluster = cls(
            run_id=run_id,
            state_dir=str(state),
            bridge=f"{PREFIX}{run_id}br",
            subnet=f"{SUBNET_BASE}.{slot}.0/24",
            gateway=f"{SUBNET_BASE}.{slot}.1",
            owner_pid=owner,
            owner_start=process_start_time(owner) if owner else None,
        )
        cluster.save()  # recorded first, so an interruption from here on is cleaned up
        try:
            cluster._start(profiles, names, captures or {})
        except BaseException:
            cluster.down()
            raise
        return cluster

    def _start(self, profiles: list[str], names: list[str] | None, captures: dict[str, str]):
        run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "kimi-kit-tests",
                "-f",
                str(self.key_file),
            ]
        )
        run(["ip", "link", "add", self.bridge, "type", "bridge"])
        run(["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge])
        run(["ip", "link", "set", self.bridge, "up"])
        counts: dict[str, int] = {}
        for index, profile in enumerate(profiles):
            number = counts.get(profile, 0)
            name = names[index] if names else f"{profile}-{number}"
            # A capture per host name, else per profile, else the profile's default.
            capture = captures.get(name) or captures.get(profile) or PROFILE_CAPTURES.get(profile)
            if not capture or not (FIXTURES / capture).is_dir():
                raise TestHostError(
                    f"no GPU capture for profile {profile!r}: add one under {FIXTURES} "
                    f"and map it in PROFILE_CAPTURES (known: {sorted(PROFILE_CAPTURES)})"
                )
            counts[profile] = number + 1
            network = ipaddress.ip_network(self.subnet)
            host = TestHost(
                name=name,
                profile=profile,
                capture=capture,
                address=str(network.network_address + 10 + index),
                netns=f"{PREFIX}-{self.run_id}-{index}",
                veth=f"{PREFIX}{self.run_id}v{index}",
                state_dir=str(self.root / "hosts" / name),
            )
            self.hosts.append(host)
            self.save()
            self._start_host(host)
            self.save()
        self._write_client_files()
        self.wait_for_ssh()

    def _start_host(self, host: TestHost) -> None:
        hdir = Path(host.state_dir)
        for sub in OVERLAID:
            (hdir / "upper" / sub).mkdir(parents=True)
            (hdir / "work" / sub).mkdir(parents=True)
        (hdir / "tmp").mkdir(mode=0o1777)
        (hdir / "tmp").chmod(0o1777)
        # The fake nvidia-smi and its capture land in the host's own /usr/local.
        local = hdir / "upper" / "usr/local"
        (local / "bin").mkdir(parents=True)
        shutil.copy(FAKE_NVIDIA_SMI, local / "bin" / "nvidia-smi")
        (local / "bin" / "nvidia-smi").chmod(0o755)
        shutil.copytree(FIXTURES / host.capture, local / "share" / "fake-nvidia-smi")
        # sshd: its own host key, keys-only login for root with the run's client key.
        host_key = hdir / "ssh_host_ed25519_key"
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name, "-f", str(host_key)])
        shutil.copy(self.key_file.with_suffix(".pub"), hdir / "authorized_keys")
        inside = "/run/testhost"  # where the host sees its own state folder
        (hdir / "sshd_config").write_text(
            "\n".join(
                [
                    f"ListenAddress {host.address}",
                    "Port 22",
                    f"HostKey {inside}/ssh_host_ed25519_key",
                    f"AuthorizedKeysFile {inside}/authorized_keys",
                    f"PidFile {inside}/sshd.pid",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "PrintMotd no",
                    "Subsystem sftp internal-sftp",
                    "",
                ]
            )
        )
        run(["ip", "netns", "add", host.netns])
        peer = f"{host.veth}p"
        run(["ip", "link", "add", host.veth, "type", "veth", "peer", "name", peer])
        run(["ip", "link", "set", host.veth, "master", self.bridge])
        run(["ip", "link", "set", host.veth, "up"])
        run(["ip", "link", "set", peer, "netns", host.netns])
        ns = ["ip", "netns", "exec", host.netns]
        run([*ns, "ip", "link", "set", peer, "name", "eth0"])
        run([*ns, "ip", "addr", "add", f"{host.address}/24", "dev", "eth0"])
        run([*ns, "ip", "link", "set", "eth0", "up"])
        run([*ns, "ip", "link", "set", "lo", "up"])
        run([*ns, "ip", "route", "add", "default", "via", self.gateway])
        mounts = [
            "set -e",
            f"hostname {host.name}",
            # /run first: the state folder is reached through it once /tmp is private.
            "mount -t tmpfs -o mode=0755 tmpfs /run",
            f"mkdir -p /run/sshd {inside}",
            f"mount --bind {hdir} {inside}",
            *(
                f"mount -t overlay overlay -o lowerdir=/{sub},upperdir={hdir}/upper/{sub},"
                f"workdir={hdir}/work/{sub} /{sub}"
                for sub in OVERLAID
            ),
            f"mount --bind {hdir}/tmp /tmp",
            "mount -t tmpfs tmpfs /dev/shm",
            f"exec {SSHD} -D -e -f {inside}/sshd_config",
        ]
        log = open(hdir / "sshd.log", "w")  # noqa: SIM115 - owned by the detached sshd
        proc = subprocess.Popen(
            [
                *ns,
                "unshare",
                "--mount",
                "--uts",
                # Own process tree: pgrep, kill and /proc on one host never see another's.
                "--pid",
                "--fork",
                "--mount-proc",
                "--propagation",
                "private",
                "sh",
                "-c",
                "\n".join(mounts),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        host.sshd_pid = proc.pid

    def _write_client_files(self) -> None:
        lines = []
        for host in self.hosts:
            key = (Path(host.state_dir) / "ssh_host_ed25519_key.pub").read_text().split()
            lines.append(f"{host.address} {key[0]} {key[1]}")
        self.known_hosts.write_text("\n".join(lines) + "\n")
        self.write_inventory()

    def write_inventory(
        self, host_vars: dict[str, dict] | None = None, group_vars: dict | None = None
    ) -> Path:
        """An inventory shaped like inventory/<profile>/hosts.yml, one group per profile."""
        profiles: dict[str, dict] = {}
        for host in self.hosts:
            entry = {"ansible_host": host.address, **(host_vars or {}).get(host.name, {})}
            profiles.setdefault(host.profile, {"hosts": {}})["hosts"][host.name] = entry
        common_args = " ".join(self.ssh_options()[2:])  # all but -i, given separately
        inventory = {
            "all": {
                "vars": {
                    "ansible_user": "root",
                    "ansible_ssh_private_key_file": str(self.key_file),
                    "ansible_ssh_common_args": common_args,
                    "ansible_python_interpreter": "/usr/bin/python3",
                    **(group_vars or {}),
                },
                "children": {"gpu_hosts": {"children": profiles}},
            }
        }
        self.inventory_dir.mkdir(exist_ok=True)
        self.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
        link = self.inventory_dir / "group_vars"
        if not link.is_symlink():
            link.symlink_to(REPO / "group_vars")
        return self.inventory

    def wait_for_ssh(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        for host in self.hosts:
            while True:
                result = self.ssh(host, "true", check=False, timeout=10)
                if result.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    log = (Path(host.state_dir) / "sshd.log").read_text()
                    raise TestHostError(
                        f"{host.name} ({host.address}) did not accept SSH within {timeout}s: "
                        f"{result.stderr.strip()}; sshd log: {log.strip()}"
                    )
                time.sleep(0.2)

    # -- tear down -----------------------------------------------------------------
    def down(self) -> None:
        """Kill every process in the hosts' namespaces, delete them, the bridge, the files."""
        for host in self.hosts:
            kill_namespace(host.netns, host.sshd_pid)
        # Links of hosts whose namespace never came up are removed by name.
        for host in self.hosts:
            run(["ip", "link", "del", host.veth], check=False)
        run(["ip", "link", "del", self.bridge], check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def kill_namespace(netns: str, leader: int = 0) -> None:
    """SIGKILL everything inside a network namespace (servers a role started included)."""
    if leader:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, signal.SIGKILL)
        # Reap it when it is our child; PID 1 may not reap here.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(leader, 0)
    for _ in range(50):
        pids = run(["ip", "netns", "pids", netns], check=False).stdout.split()
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.05)
    run(["ip", "netns", "delete", netns], check=False)


def free_subnet_slot() -> int:
    used = run(["ip", "-o", "-4", "addr", "show"]).stdout
    taken = {
        int(part.split(".")[2])
        for part in used.split()
        if part.startswith(f"{SUBNET_BASE}.") and part.count(".") == 3
    }
    for cluster in known_runs():
        taken.add(int(cluster.subnet.split(".")[2]))
    for slot in range(1, 255):
        if slot not in taken:
            return slot
    raise TestHostError(f"no free {SUBNET_BASE}.x.0/24 subnet for test hosts")


def known_runs() -> list[TestHostCluster]:
    runs = []
    if RUNS_ROOT.is_dir():
        for state in sorted(RUNS_ROOT.glob(f"{PREFIX}-*")):
            try:
                runs.append(TestHostCluster.load(state))
            except (OSError, ValueError, TypeError):
                # A run interrupted before it recorded itself has only files to remove;
                # a young one may be another process between mkdir and its first save.
                with contextlib.suppress(OSError):
                    if time.time() - state.stat().st_mtime > 60:
                        shutil.rmtree(state, ignore_errors=True)
    return runs


def orphan_namespaces() -> list[str]:
    """Namespaces with our prefix that no recorded run owns (state folder already gone)."""
    owned = {h.netns for c in known_runs() for h in c.hosts}
    listed = run(["ip", "netns", "list"], check=False).stdout.split("\n")
    names = [line.split()[0] for line in listed if line.strip()]
    return [n for n in names if n.startswith(f"{PREFIX}-") and n not in owned]


def down_runs(stale_only: bool) -> list[str]:
    removed = []
    for cluster in known_runs():
        if stale_only and cluster.owner_alive():
            continue
        cluster.down()
        removed.append(cluster.state_dir)
    if not stale_only or not any(c.owner_alive() for c in known_runs()):
        for netns in orphan_namespaces():
            kill_namespace(netns)
            removed.append(netns)
    return removed


def check_prerequisites() -> None:
    if os.geteuid() != 0:
        raise TestHostError("test hosts need root (network and mount namespaces)")
    missing = [t for t in ("ip", "unshare", "ssh", "ssh-keygen") if not shutil.which(t)]
    if not Path(SSHD).exists():
        missing.append(SSHD)
    if missing:
        raise TestHostError(
            f"missing {', '.join(missing)}: install Debian's openssh-server, openssh-client "
            "and iproute2 (make test-deps does)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.testhosts",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start hosts, print the inventory path")
    up.add_argument(
        "--profiles", required=True, help="comma-separated, one host each, e.g. ct200,h200,b200"
    )
    down = sub.add_parser("down", help="remove hosts")
    which = down.add_mutually_exclusive_group(required=True)
    which.add_argument("--state-dir", type=Path)
    which.add_argument("--stale", action="store_true", help="runs whose owner process is gone")
    which.add_argument("--all", action="store_true", help="every run, kept ones included")
    args = parser.parse_args(argv)
    if args.command == "up":
        cluster = TestHostCluster.up(args.profiles.split(","), owner_pid=0)
        for host in cluster.hosts:
            print(f"{host.name}\t{host.profile}\t{host.address}", file=sys.stderr)
        print(cluster.inventory)
        return 0
    if args.state_dir:
        TestHostCluster.load(args.state_dir).down()
        return 0
    for removed in down_runs(stale_only=args.stale):
        print(f"removed {removed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
