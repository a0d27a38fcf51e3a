"""SSH test hosts in Linux network namespaces, for running the playbooks for real.

Each host is a network namespace on a private bridge with its own address, its own
hostname (UTS namespace), its own process tree (PID namespace) and its own mount namespace in
which /etc, /opt, /var, /usr/local, /root, /srv and /home are copy-on-write overlays (/root
starting as a fresh root home) and /tmp, /run and /dev/shm are private: whatever a role writes
stays on that host. Its sshd takes keys only. A fake `nvidia-smi` on its PATH replays a GPU
capture from tests/fixtures/gpu-hosts/.

Besides root, every host has an unprivileged user, SUDO_USER, with a home under /home, whom the
run's client key logs in too and who may run anything through sudo without a password: the
admin account of many real GPU hosts, where root does not log in over SSH. A test connects as
it (`write_inventory(sudo_user_hosts=...)` sets ansible_user) to prove the kit works through
`become`. The user, its sudoers file and a line naming the host in /etc/hosts (sudo resolves
its own host name) are made inside the host, on its own /etc and /home overlays.

PID 1 of a host is one of two (`init`):
- `sshd` (the default): sshd itself, as in a container; the server role then uses the kit's
  own supervisor.
- `systemd`: systemd boots the host, as on a real GPU host, and runs the distribution's
  ssh.service; the server role then installs and runs a real systemd unit. systemd acts on
  whatever it sees, so such a host gets a private root (a tmpfs whose /usr is this machine's,
  read-only, and whose other directories are the overlays above or private mounts; /proc/sys
  and /sys read-only; a cgroup namespace of its own), every unit of this machine is masked
  before boot except ssh, journald and the passive targets and slices, every generator is
  disabled, and capabilities that reach the machine's kernel (modules, clock, raw I/O, kernel
  log) are dropped from its bounding set. Units a test or the kit installs later are not masked.

Every run is recorded under RUNS_ROOT so that a later `down --stale` removes what an
interrupted run left behind (namespaces, processes, cgroups, bridge, files).

    python -m tests.support.testhosts up --profiles ct200,h200,b200 [--systemd ct200-0]
    python -m tests.support.testhosts down --state-dir DIR
    python -m tests.support.testhosts down --stale | --all
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import importlib.util
import ipaddress
import json
import os
import py_compile
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from tests.support import host_bytecode

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "gpu-hosts"
FAKE_NVIDIA_SMI = REPO / "tests" / "support" / "fakes" / "nvidia_smi.py"
RUNS_ROOT = Path(os.environ.get("KIMI_TESTHOSTS_ROOT", "/tmp/kimi-kit-testhosts"))
PREFIX = "kkt"  # namespaces, links and run folders all start with it
SUBNET_BASE = "10.213"  # 10.213.<slot>.0/24 per run; private range, never routed off the machine
OVERLAID = ("etc", "opt", "var", "usr/local", "root", "srv", "home")
# Mounted afresh on every sshd host (/run first: the state folder is reached through it).
PRIVATE_MOUNTS = (Path("/tmp"), Path("/run"), Path("/dev/shm"))
# Capture replayed by each profile's hosts. h200-x2 is a real capture; the others are built.
PROFILE_CAPTURES = {"ct200": "ct200-x8", "h200": "h200-x2", "b200": "b200-x8"}
SSHD = "/usr/sbin/sshd"
# The hosts' Python, which Ansible runs modules with (ansible_python_interpreter).
SYSTEM_PYTHON = "/usr/bin/python3"
# A host's /usr/local/bin/nvidia-smi: the fake from /usr/local/libexec, whose captures it finds
# in /usr/local/share as it would from /usr/local/bin.
NVIDIA_SMI_LAUNCHER = f"""#!{SYSTEM_PYTHON}
import sys

sys.path.insert(0, "/usr/local/libexec")
from nvidia_smi import main

sys.exit(main(sys.argv[1:]))
"""
# What the hosts' Pythons compiled (tests/support/host_bytecode.py), shared by every host: bound
# at host_bytecode.CACHE_DIR on each.
HOST_BYTECODE_DIR = REPO / "tests" / ".state" / "host-bytecode"
SYSTEMD = "/lib/systemd/systemd"
# Units a systemd host may start: its SSH server, the journal (the server role reads the
# server's log from it) and the passive targets and slices that order boot. Everything else
# this machine has is masked before boot.
SYSTEMD_ALLOWED = (
    "ssh.service",
    "systemd-journald.service",
    "systemd-journald.socket",
    "systemd-journald-dev-log.socket",
)
SYSTEMD_PASSIVE_SUFFIXES = (".target", ".slice")
# Where units of this machine live, as a booted systemd would find them (this machine's
# /etc/systemd/system is the lower layer of the host's /etc).
UNIT_DIRS = ("/etc/systemd/system", "/usr/local/lib/systemd/system", "/usr/lib/systemd/system")
GENERATOR_DIRS = (
    "/usr/lib/systemd/system-generators",
    "/usr/local/lib/systemd/system-generators",
    "/etc/systemd/system-generators",
    "/usr/lib/systemd/system-environment-generators",
    "/etc/systemd/system-environment-generators",
)
# Capabilities that act on the machine's kernel rather than on the host's namespaces.
DROPPED_CAPABILITIES = (
    "sys_module",
    "sys_rawio",
    "sys_time",
    "syslog",
    "sys_pacct",
    "mac_admin",
    "mac_override",
    "wake_alarm",
    "block_suspend",
    "bpf",
    "perfmon",
)
# Device nodes a booted host needs; /dev is otherwise a private tmpfs (no real devices).
DEVICE_NODES = ("null", "zero", "full", "random", "urandom", "tty")
INIT_CHOICES = ("sshd", "systemd")
# The unprivileged user every host has (module docstring); never root's uid.
SUDO_USER = "kimiops"
SUDO_TOOLS = ("/usr/bin/sudo", "/usr/sbin/visudo", "/usr/sbin/useradd", "/usr/sbin/usermod")


class TestHostError(RuntimeError):
    pass


def run(cmd: list[str], check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if check and result.returncode != 0:
        raise TestHostError(
            f"{' '.join(cmd)} failed ({result.returncode}): {result.stderr.strip()}"
        )
    return result


# A run's folder is a tmpfs of its own. What its hosts write (the upper layers of their
# overlays: venvs, weights, results) never goes through the machine's disk journal and
# writeback, and tearing the run down is one unmount instead of an unlink per file: on ext4
# that took 1.4-1.5 core-s per 30,000 files, unmounting a tmpfs that holds them 0.1
# (tests/benchmarks/run_folder_teardown.py).
def mount_run_folder(folder: Path) -> None:
    run(["mount", "-t", "tmpfs", "-o", "mode=0700", f"{PREFIX}-run", str(folder)], timeout=30)


def remove_run_folder(folder: Path) -> None:
    """Unmounted (lazily: a process that still holds a file there keeps it until it lets go),
    then removed; a folder that was never mounted is removed file by file."""
    if os.path.ismount(folder):
        run(["umount", "--lazy", str(folder)], check=False, timeout=30)
    shutil.rmtree(folder, ignore_errors=True)


# What a freshly installed Debian host gives root: base-files' dot files (or /etc/skel's).
ROOT_DOT_FILES = {
    ".bashrc": ("/usr/share/base-files/dot.bashrc", "/etc/skel/.bashrc"),
    ".profile": ("/usr/share/base-files/dot.profile", "/etc/skel/.profile"),
}


def lower_dir(hdir: Path, sub: str) -> str:
    """What a host's overlay of /<sub> lies over: this machine's folder, except for /root,
    which lies over a fresh root home (fresh_root_home)."""
    return str(hdir / "fresh-root") if sub == "root" else f"/{sub}"


def overlaid(path: Path) -> bool:
    """Whether a host sees path (absolute, as on this machine) in a folder of its own overlay."""
    return any(path.is_relative_to(f"/{sub}") for sub in OVERLAID)


@functools.cache
def system_sitecustomize() -> Path | None:
    """The file the hosts' system Python reads as sitecustomize, where it lies in a folder each
    host overlays (Debian and Ubuntu link it to /etc/python3.X/): every Python of the host, a
    venv's too, reads the host's own copy. None elsewhere."""
    found = run(
        [
            SYSTEM_PYTHON,
            "-c",
            "import os, sysconfig; p = os.path.join(sysconfig.get_paths()['stdlib'],"
            " 'sitecustomize.py'); print(os.path.realpath(p) if os.path.islink(p) else '')",
        ]
    ).stdout.strip()
    if found and overlaid(Path(found)):
        return Path(found)
    return None


@functools.cache
def system_site_packages() -> Path:
    """The folder under /usr/local where the hosts' system Python (the one Ansible runs
    modules with) reads .pth files."""
    found = run(
        [
            SYSTEM_PYTHON,
            "-c",
            "import site, sys; print(next(p for p in sys.path if p.startswith('/usr/local/')"
            " and p.endswith(('site-packages', 'dist-packages'))))",
        ]
    ).stdout.strip()
    return Path(found)


@functools.cache
def foreign_pth_files() -> tuple[Path, ...]:
    """The .pth files of the hosts' system Python that no distribution package installed:
    this machine's own additions (a local pip install, a certificate hook of its container),
    not a GPU host's. Python runs each at every start: one that imported certifi took 30 of the
    38 ms `python3 -c pass` cost a host, and the roles start thousands. The hosts see them
    empty (mask_foreign_pth). Without dpkg nothing tells them apart, and all stay."""
    folders = run(
        [SYSTEM_PYTHON, "-c", "import site; print(*site.getsitepackages(), sep='\\n')"]
    ).stdout.split()
    found = sorted({path for folder in folders for path in Path(folder).glob("*.pth")})
    if not found:
        return ()
    try:
        # dpkg -S fails when any path is no package's; it still names the owners of the rest.
        owned = run(["dpkg", "-S", *map(str, found)], check=False, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    # `package[, package]: /path` per file some package installed.
    installed = {Path(line.split(": ", 1)[1]) for line in owned.splitlines() if ": /" in line}
    return tuple(path for path in found if path not in installed)


def mask_foreign_pth(hdir: Path, root: str = "") -> list[str]:
    """Shows the host foreign_pth_files() empty: under a folder the host overlays, an empty
    file in its upper layer; elsewhere (/usr is this machine's) the returned mount commands
    bind an empty file over each, at root + the file's path."""
    empty = hdir / "empty.pth"
    empty.touch()
    binds = []
    for path in foreign_pth_files():
        if overlaid(path):
            upper = hdir / "upper" / path.relative_to("/")
            upper.parent.mkdir(parents=True, exist_ok=True)
            upper.write_text("")
        else:
            binds.append(f"mount --bind {empty} {root}{path}")
    return binds


def shared_host_bytecode() -> Path:
    """HOST_BYTECODE_DIR, there: written by the hosts' root only."""
    HOST_BYTECODE_DIR.mkdir(parents=True, exist_ok=True)
    HOST_BYTECODE_DIR.chmod(0o755)
    return HOST_BYTECODE_DIR


def checkout_under_private_mount() -> bool:
    """Whether this checkout lies under a folder an sshd host mounts its own over (/tmp, /run,
    /dev/shm): tests that start the checkout's simulator on a host need it bound back."""
    return any(REPO.is_relative_to(private) for private in PRIVATE_MOUNTS)


def overlay_mount(hdir: Path, sub: str, target: str) -> str:
    """The mount command of a host's copy-on-write /<sub> at target."""
    return (
        f"mount -t overlay overlay -o lowerdir={lower_dir(hdir, sub)},"
        f"upperdir={hdir}/upper/{sub},workdir={hdir}/work/{sub} {target}"
    )


def fresh_root_home(hdir: Path) -> None:
    """A fresh host's root home, with its dot files: this machine's own (tokens, caches, pip's
    config, a .bashrc that sshd's bash sources on every session and that may start tools, as
    pyenv's init does at ~0.1 s of CPU a session) never shows through to a host."""
    folder = Path(lower_dir(hdir, "root"))
    folder.mkdir(mode=0o700)
    # The merged folder takes the upper one's mode: root's home is private.
    (hdir / "upper" / "root").chmod(0o700)
    for name, candidates in ROOT_DOT_FILES.items():
        source = next((Path(c) for c in candidates if Path(c).is_file()), None)
        if source is not None:
            shutil.copyfile(source, folder / name)


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
    init: str = "sshd"
    cgroup: str = ""  # systemd hosts: their cgroup (v2) on this machine

    @property
    def console_log(self) -> Path:
        """What PID 1 printed: sshd's log, or what the boot script said before systemd ran
        (systemd itself logs to the host's journal: journal_tail())."""
        return Path(self.state_dir) / ("console.log" if self.init == "systemd" else "sshd.log")

    def init_pid(self) -> int | None:
        """This machine's pid of the host's PID 1: the launcher's one child (unshare forks it)."""
        try:
            children = Path(f"/proc/{self.sshd_pid}/task/{self.sshd_pid}/children").read_text()
        except OSError:
            return None
        return int(children.split()[0]) if children.split() else None

    def journal_tail(self, lines: int = 60) -> str:
        """The end of a systemd host's journal, read from outside (SSH may be what failed)."""
        pid = self.init_pid()
        if self.init != "systemd" or not pid:
            return ""
        result = run(
            ["nsenter", "-t", str(pid), "-a", "journalctl", "--no-pager", "-n", str(lines)],
            check=False,
            timeout=20,
        )
        return (result.stdout + result.stderr).strip()

    def ssh_command(self, cluster: TestHostCluster, command: str, user: str = "root") -> list[str]:
        return [
            "ssh",
            *cluster.ssh_options(),
            *cluster.multiplex_options(),
            f"{user}@{self.address}",
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
            # 5 s once left a test host unreachable while the suite loaded a 2-core machine;
            # an address with nothing behind it still fails at once (no route to host).
            "ConnectTimeout=15",
        ]

    def multiplex_options(self) -> list[str]:
        """The tests' own commands on a host share one connection per host and user: each new
        one cost a key exchange at both ends (about 0.07 CPU-s here, 566 of them in make test).
        Ansible keeps its own connections (ansible_ssh_args). A socket path too long for a Unix
        socket (KIMI_TESTHOSTS_ROOT deep) connects anew each time instead: ssh would exit."""
        folder = f"{self.root / 'cm'}/"
        # %C becomes 40 hex digits, and the master binds the path with "." and 16 random
        # characters appended before it renames it; sun_path holds 107 and a NUL.
        if len(folder) + 40 + 17 > 107:
            return []
        path = f"{folder}%C"
        return [
            "-o",
            "ControlMaster=auto",
            "-o",
            "ControlPersist=120s",
            "-o",
            f"ControlPath={path}",
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
        user: str = "root",
    ):
        if isinstance(host, str):
            host = self.host(host)
        return run(
            host.ssh_command(self, command, user=user), check=check, timeout=timeout, input=input
        )

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
        systemd: Collection[str] = (),
    ) -> TestHostCluster:
        """Start one host per profile. owner_pid=0 keeps them after this process exits.
        Hosts named in `systemd` boot systemd as PID 1; the others run sshd as PID 1."""
        check_prerequisites(systemd=bool(systemd))
        if len(profiles) > 200:
            raise TestHostError("at most 200 test hosts per run")
        owner = os.getpid() if owner_pid is None else owner_pid
        RUNS_ROOT.mkdir(parents=True, exist_ok=True)
        # Test runs side by side (pytest-xdist workers) take their subnet and name in turn:
        # a run is recorded before the lock is let go, so the next one sees its slot taken.
        with open(RUNS_ROOT / ".allocate.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            run_id = secrets.token_hex(2)
            while (RUNS_ROOT / f"{PREFIX}-{run_id}").exists():
                run_id = secrets.token_hex(2)
            slot = free_subnet_slot()
            state = RUNS_ROOT / f"{PREFIX}-{run_id}"
            state.mkdir(parents=True, mode=0o700)
            mount_run_folder(state)
            (state / "cm").mkdir(mode=0o700)
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
            cluster._start(profiles, names, captures or {}, set(systemd))
        except BaseException:
            cluster.down()
            raise
        return cluster

    def _start(
        self,
        profiles: list[str],
        names: list[str] | None,
        captures: dict[str, str],
        systemd: set[str],
    ):
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
        chosen = set(names or [])
        unknown = systemd - chosen if names else set()
        if unknown or (systemd and not names):
            raise TestHostError(
                f"systemd hosts {sorted(systemd)} must be named among the hosts ({names})"
            )
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
                init="systemd" if name in systemd else "sshd",
            )
            self.hosts.append(host)
            self.save()
            self._start_host(host)
            self.save()
        self._write_client_files()
        self.wait_for_ssh()
        for host in self.hosts:
            self.add_sudo_user(host)

    def _start_host(self, host: TestHost) -> None:
        hdir = Path(host.state_dir)
        for sub in OVERLAID:
            (hdir / "upper" / sub).mkdir(parents=True)
            (hdir / "work" / sub).mkdir(parents=True)
        # sshd reads a user's authorized keys as that user: SUDO_USER must reach the file, which
        # an sshd host sees in this folder (its private host key in it stays 0600).
        hdir.chmod(0o755)
        fresh_root_home(hdir)
        (hdir / "tmp").mkdir(mode=0o1777)
        (hdir / "tmp").chmod(0o1777)
        # The fake nvidia-smi and its capture land in the host's own /usr/local: a launcher
        # on PATH and the fake itself beside it, with its bytecode (the roles run nvidia-smi
        # hundreds of times; a script is compiled at every start, a module once).
        local = hdir / "upper" / "usr/local"
        (local / "bin").mkdir(parents=True)
        (local / "libexec").mkdir(parents=True)
        fake = local / "libexec" / FAKE_NVIDIA_SMI.name
        shutil.copy(FAKE_NVIDIA_SMI, fake)
        py_compile.compile(
            str(fake), cfile=importlib.util.cache_from_source(str(fake)), doraise=True
        )
        (local / "bin" / "nvidia-smi").write_text(NVIDIA_SMI_LAUNCHER)
        (local / "bin" / "nvidia-smi").chmod(0o755)
        shutil.copytree(FIXTURES / host.capture, local / "share" / "fake-nvidia-smi")
        # The host's Pythons keep the bytecode of what they compile: Ansible's module payloads,
        # pip's and ensurepip's files (tests/support/host_bytecode.py says why).
        site_packages, sitecustomize = system_site_packages(), system_sitecustomize()
        host_bytecode.install_into(
            hdir / "upper" / site_packages.relative_to("/"),
            hdir / "upper" / Path(host_bytecode.CACHE_DIR).relative_to("/"),
            pth=sitecustomize is None,
        )
        if sitecustomize is not None:
            host_bytecode.write_sitecustomize(
                hdir / "upper" / sitecustomize.relative_to("/"),
                sitecustomize,
                str(site_packages / f"{host_bytecode.MODULE_NAME}.py"),
            )
        # sshd: its own host key, keys-only login for root with the run's client key.
        host_key = hdir / "ssh_host_ed25519_key"
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name, "-f", str(host_key)])
        self._start_network(host)
        if host.init == "systemd":
            self._boot_systemd(host)
        else:
            self._start_sshd(host)

    def sshd_config(self, host: TestHost, keys_dir: str) -> str:
        return "\n".join(
            [
                f"ListenAddress {host.address}",
                "Port 22",
                f"HostKey {keys_dir}/ssh_host_ed25519_key",
                f"AuthorizedKeysFile {keys_dir}/authorized_keys",
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

    def _start_network(self, host: TestHost) -> None:
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

    def _launch(self, host: TestHost, argv: list[str]) -> None:
        """Starts a host's first process detached, its output in the host's console log."""
        log = open(host.console_log, "w")  # noqa: SIM115 - owned by the detached process
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        host.sshd_pid = proc.pid

    def _start_sshd(self, host: TestHost) -> None:
        hdir = Path(host.state_dir)
        shutil.copy(self.key_file.with_suffix(".pub"), hdir / "authorized_keys")
        inside = "/run/testhost"  # where the host sees its own state folder
        (hdir / "sshd_config").write_text(
            self.sshd_config(host, inside) + f"PidFile {inside}/sshd.pid\n"
        )
        hidden_checkout = checkout_under_private_mount()
        mounts = [
            "set -e",
            f"hostname {host.name}",
            # A checkout under a folder the host makes private (a clone in /tmp) is held at
            # the state folder first, then bound back at its own path, read-only.
            *(
                [f"mkdir -p {hdir}/checkout", f"mount --bind {REPO} {hdir}/checkout"]
                if hidden_checkout
                else []
            ),
            # /run first: the state folder is reached through it once /tmp is private.
            "mount -t tmpfs -o mode=0755 tmpfs /run",
            f"mkdir -p /run/sshd {inside}",
            f"mount --rbind {hdir} {inside}",
            *(overlay_mount(hdir, sub, f"/{sub}") for sub in OVERLAID),
            f"mount --bind {shared_host_bytecode()} {host_bytecode.CACHE_DIR}",
            *mask_foreign_pth(hdir),
            f"mount --bind {hdir}/tmp /tmp",
            "mount -t tmpfs tmpfs /dev/shm",
            *(
                [
                    f"mkdir -p {REPO}",
                    f"mount --bind {inside}/checkout {REPO}",
                    f"mount -o remount,bind,ro {REPO}",
                ]
                if hidden_checkout
                else []
            ),
            f"exec {SSHD} -D -e -f {inside}/sshd_config",
        ]
        # --mount-proc: pgrep, kill and /proc on one host never see another's processes.
        self._launch(host, in_namespaces(host, ["--mount-proc"], "\n".join(mounts)))

    def _boot_systemd(self, host: TestHost) -> None:
        hdir = Path(host.state_dir)
        etc = hdir / "upper" / "etc"
        prepare_systemd_etc(etc, host.name)
        ssh_dir = etc / "ssh"
        ssh_dir.mkdir(parents=True, exist_ok=True)
        for suffix in ("", ".pub"):
            shutil.copy(hdir / f"ssh_host_ed25519_key{suffix}", ssh_dir)
        shutil.copy(self.key_file.with_suffix(".pub"), ssh_dir / "authorized_keys")
        (ssh_dir / "sshd_config").write_text(self.sshd_config(host, "/etc/ssh"))
        host.cgroup = str(new_cgroup(host.netns))
        self.save()
        root = hdir / "root"
        root.mkdir()
        mounts = [
            "set -e",
            # A tmpfs root: pivot_root needs a mount, and nothing of this machine's / shows.
            f"mount -t tmpfs -o mode=0755 tmpfs {root}",
            *(
                f"mkdir -p {root}/{sub}"
                for sub in (*OVERLAID, "usr", "tmp", "run", "dev", "proc", "sys", "mnt")
            ),
            *(f"ln -s usr/{name} {root}/{name}" for name in ("bin", "sbin", "lib", "lib64")),
            f"mount --bind /usr {root}/usr",
            *mask_foreign_pth(hdir, str(root)),
            f"mount -o remount,bind,ro {root}/usr",
            *(overlay_mount(hdir, sub, f"{root}/{sub}") for sub in OVERLAID),
            f"mount --bind {shared_host_bytecode()} {root}{host_bytecode.CACHE_DIR}",
            f"mount --bind {hdir}/tmp {root}/tmp",
            f"mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs {root}/run",
            f"mount -t tmpfs -o mode=0755,nosuid tmpfs {root}/dev",
            *(
                f"touch {root}/dev/{node} && mount --bind /dev/{node} {root}/dev/{node}"
                for node in DEVICE_NODES
            ),
            f"mkdir {root}/dev/pts {root}/dev/shm",
            f"mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts {root}/dev/pts",
            f"ln -s pts/ptmx {root}/dev/ptmx",
            f"ln -s /proc/self/fd {root}/dev/fd",
            *(
                f"ln -s /proc/self/fd/{fd} {root}/dev/{name}"
                for fd, name in enumerate(("stdin", "stdout", "stderr"))
            ),
            f"mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs {root}/dev/shm",
            f"mount -t proc -o nosuid,nodev,noexec proc {root}/proc",
            # Kernel-wide values stay out of reach: read-only /proc/sys and /sys.
            f"mount --bind {root}/proc/sys {root}/proc/sys",
            f"mount -o remount,bind,ro {root}/proc/sys",
            f"mount -t sysfs -o ro,nosuid,nodev,noexec sysfs {root}/sys",
            # The cgroup namespace makes the host's own cgroup the root systemd sees.
            f"mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 {root}/sys/fs/cgroup",
            f"hostname {host.name}",
            f"cd {root}",
            "mkdir .oldroot",
            "pivot_root . .oldroot",
            "umount -l /.oldroot",
            "rmdir /.oldroot",
            # A clean environment, as a booted machine's PID 1 has; `container` tells systemd
            # where it runs, so units with ConditionVirtualization=!container stay off.
            "exec env -i container=kimi-testhost setpriv --bounding-set "
            + ",".join(f"-{cap}" for cap in DROPPED_CAPABILITIES)
            + f" {SYSTEMD} --system --show-status=no",
        ]
        # Into the host's cgroup first, so that the new cgroup namespace is rooted there.
        enter_cgroup = ["sh", "-c", 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"', "sh"]
        boot = in_namespaces(host, ["--cgroup"], "\n".join(mounts))
        self._launch(host, [*enter_cgroup, host.cgroup, *boot])

    def _write_client_files(self) -> None:
        lines = []
        for host in self.hosts:
            key = (Path(host.state_dir) / "ssh_host_ed25519_key.pub").read_text().split()
            lines.append(f"{host.address} {key[0]} {key[1]}")
        self.known_hosts.write_text("\n".join(lines) + "\n")
        self.write_inventory()

    def write_inventory(
        self,
        host_vars: dict[str, dict] | None = None,
        group_vars: dict | None = None,
        sudo_user_hosts: Collection[str] = (),
    ) -> Path:
        """An inventory shaped like inventory/<profile>/hosts.yml, one group per profile. The
        run connects as root, except to the hosts in sudo_user_hosts: as SUDO_USER there."""
        unknown = set(sudo_user_hosts) - {host.name for host in self.hosts}
        if unknown:
            raise TestHostError(f"sudo_user_hosts names no host of this run: {sorted(unknown)}")
        profiles: dict[str, dict] = {}
        for host in self.hosts:
            entry = {
                "ansible_host": host.address,
                **({"ansible_user": SUDO_USER} if host.name in sudo_user_hosts else {}),
                **(host_vars or {}).get(host.name, {}),
            }
            profiles.setdefault(host.profile, {"hosts": {}})["hosts"][host.name] = entry
        common_args = " ".join(self.ssh_options()[2:])  # all but -i, given separately
        inventory = {
            "all": {
                "vars": {
                    "ansible_user": "root",
                    "ansible_ssh_private_key_file": str(self.key_file),
                    "ansible_ssh_common_args": common_args,
                    # Ansible's default without -C: the payloads are zip archives, and on
                    # a bridge compression only costs CPU.
                    "ansible_ssh_args": "-o ControlMaster=auto -o ControlPersist=60s",
                    "ansible_python_interpreter": SYSTEM_PYTHON,
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

    def add_sudo_user(self, host: TestHost) -> None:
        """SUDO_USER on a host that accepts SSH, made by root inside it; then checked as the
        kit uses it: it logs in with the client key and sudo runs as root without a password
        and without a word on stderr (a warning there would reach every become task)."""
        self.ssh(host, sudo_user_script(host.name), timeout=30)
        said = self.ssh(host, "sudo -n id -un", user=SUDO_USER, check=False, timeout=30)
        if said.returncode != 0 or said.stdout.strip() != "root" or said.stderr.strip():
            raise TestHostError(
                f"{host.name}: {SUDO_USER} cannot log in and sudo to root "
                f"({said.returncode}): {said.stdout.strip()} {said.stderr.strip()}"
            )

    def wait_for_ssh(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        for host in self.hosts:
            while True:
                result = self.ssh(host, "true", check=False, timeout=10)
                if result.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    log = host.console_log.read_text(errors="replace")[-4000:]
                    raise TestHostError(
                        f"{host.name} ({host.address}, PID 1 {host.init}) did not accept SSH "
                        f"within {timeout}s: {result.stderr.strip()}; its console: {log.strip()}"
                        + (f"; its journal:\n{host.journal_tail()}" if host.cgroup else "")
                    )
                time.sleep(0.2)

    # -- tear down -----------------------------------------------------------------
    def down(self) -> None:
        """Kill every process in the hosts' namespaces, delete them, the bridge, the files."""
        for host in self.hosts:
            if host.init != "systemd":
                end_sshd_host(host)
            kill_namespace(host.netns, host.sshd_pid)
            if host.cgroup:
                remove_cgroup(Path(host.cgroup))
        # Links of hosts whose namespace never came up are removed by name.
        for host in self.hosts:
            run(["ip", "link", "del", host.veth], check=False)
        run(["ip", "link", "del", self.bridge], check=False)
        remove_run_folder(self.root)


def sudoers_entry(user: str) -> str:
    """/etc/sudoers.d/<user>: anything as anyone, no password (Ansible's become cannot type one)."""
    return f"{user} ALL=(ALL:ALL) NOPASSWD: ALL\n"


def sudo_user_script(hostname: str, user: str = SUDO_USER) -> str:
    """Shell script that root runs inside a host: the host's name in /etc/hosts, `user` with a
    home, an unlocked account without password (sshd refuses a locked one when it runs without
    PAM) and its sudoers file, checked by visudo before sudo reads it. Idempotent."""
    if not user.isidentifier() or user == "root" or not hostname.replace("-", "").isalnum():
        raise TestHostError(f"refusing the user {user!r} or host name {hostname!r}")
    return "\n".join(
        [
            "set -eu",
            # Appended on a line of its own, even to a file that ends without a newline.
            '[ -z "$(tail -c 1 /etc/hosts)" ] || echo >> /etc/hosts',
            f"grep -qw -- {hostname} /etc/hosts"
            f" || printf '127.0.1.1\\t%s\\n' {hostname} >> /etc/hosts",
            f"id -u {user} >/dev/null 2>&1 || useradd --create-home --shell /bin/bash {user}",
            f"usermod --password '*' {user}",
            # A name with a dot is skipped by sudo's includedir: the check runs on it first.
            "new=$(mktemp /etc/sudoers.d/.new.XXXXXX)",
            f"printf '%s\\n' '{sudoers_entry(user).strip()}' > \"$new\"",
            'chmod 0440 "$new"',
            'visudo -cqf "$new"',
            f'mv "$new" /etc/sudoers.d/{user}',
            "",
        ]
    )


def in_namespaces(host: TestHost, extra: list[str], script: str) -> list[str]:
    """argv that runs a shell script as PID 1 of the host's own network, mount, UTS and PID
    namespaces (mounts private to it)."""
    return [
        *("ip", "netns", "exec", host.netns),
        *("unshare", "--mount", "--uts", "--pid", "--fork", *extra),
        *("--propagation", "private", "sh", "-c", script),
    ]


def end_sshd_host(host: TestHost, timeout: float = 3.0) -> None:
    """Stop an sshd host from the inside out, so that what it ran counts as this process's
    children's CPU (make test's CPU per file, tests/support/timings.py): SIGTERM to the
    namespace's PID 1 (sshd, which has reaped every SSH session and module run of the host),
    unshare (host.sshd_pid) reaps it and exits, and this process reaps unshare. Killed from
    outside (SIGKILL to the group), PID 1 would be reaped by no one here and the host's CPU
    counted nowhere. Does nothing it cannot do within the timeout: kill_namespace follows
    either way."""
    init = host.init_pid()
    if init is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(init, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done, _status = os.waitpid(host.sshd_pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(0.02)


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


def prepare_systemd_etc(etc: Path, hostname: str) -> None:
    """The upper layer of a systemd host's /etc, written before it boots: every unit this
    machine has masked but SYSTEMD_ALLOWED and the passive targets and slices, every generator
    off (they would turn this machine's fstab and init scripts into units), ssh.service wanted
    by multi-user.target, and the host's own name and machine id."""
    units = etc / "systemd" / "system"
    (units / "multi-user.target.wants").mkdir(parents=True, exist_ok=True)
    for folder in map(Path, UNIT_DIRS):
        if not folder.is_dir():
            continue
        for entry in [*folder.iterdir(), *folder.glob("*.wants/*"), *folder.glob("*.requires/*")]:
            name = entry.name
            if entry.is_dir() and not entry.is_symlink():
                continue
            if name in SYSTEMD_ALLOWED or name.endswith(SYSTEMD_PASSIVE_SUFFIXES):
                continue
            if "." not in name:
                continue
            mask = units / name
            if not mask.is_symlink():
                mask.symlink_to("/dev/null")
    for folder in map(Path, GENERATOR_DIRS):
        if not folder.is_dir():
            continue
        off = etc / "systemd" / folder.name
        off.mkdir(parents=True, exist_ok=True)
        for generator in folder.iterdir():
            if not (off / generator.name).is_symlink():
                (off / generator.name).symlink_to("/dev/null")
    wants = units / "multi-user.target.wants" / "ssh.service"
    if not wants.is_symlink():
        wants.symlink_to("/usr/lib/systemd/system/ssh.service")
    (etc / "hostname").write_text(f"{hostname}\n")
    (etc / "machine-id").write_text(secrets.token_hex(16) + "\n")
    (etc / "fstab").write_text("# test host: nothing to mount\n")


def mounts() -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every mount this process's mount namespace sees, in
    the order /proc/self/mounts lists them."""
    lines = Path("/proc/self/mounts").read_text().splitlines()
    return [(fields[1], fields[2]) for fields in map(str.split, lines) if len(fields) > 2]


def cgroup2_root() -> Path:
    """Where this machine mounts the cgroup v2 hierarchy (alone, or beside v1 controllers)."""
    for point, kind in mounts():
        if kind == "cgroup2":
            return Path(point)
    raise TestHostError(
        "systemd test hosts need a cgroup v2 hierarchy and this machine mounts none: "
        "mount one (mount -t cgroup2 none /sys/fs/cgroup/unified) or run sshd hosts only"
    )


def new_cgroup(name: str) -> Path:
    path = cgroup2_root() / name
    path.mkdir()
    return path


def remove_cgroup(path: Path) -> None:
    """rmdir from the leaves up (systemd makes a tree); only empty cgroups can go."""
    if not path.is_dir():
        return
    for _ in range(50):
        for folder in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if folder.is_dir():
                with contextlib.suppress(OSError):
                    folder.rmdir()
        with contextlib.suppress(OSError):
            path.rmdir()
        if not path.exists():
            return
        time.sleep(0.05)  # its last processes are still exiting


def orphan_cgroups(owned: set[str]) -> list[Path]:
    try:
        root = cgroup2_root()
    except TestHostError:
        return []
    return [p for p in root.glob(f"{PREFIX}-*") if p.is_dir() and str(p) not in owned]


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
                        remove_run_folder(state)
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
        owned = {h.cgroup for c in known_runs() for h in c.hosts if h.cgroup}
        for cgroup in orphan_cgroups(owned):
            remove_cgroup(cgroup)
            removed.append(str(cgroup))
    return removed


def check_prerequisites(systemd: bool = False) -> None:
    if os.geteuid() != 0:
        raise TestHostError("test hosts need root (network and mount namespaces)")
    missing = [t for t in ("ip", "unshare", "ssh", "ssh-keygen") if not shutil.which(t)]
    # The hosts' SUDO_USER: made with this machine's tools, which the hosts share.
    missing += [t for t in SUDO_TOOLS if not Path(t).exists()]
    if not Path(SSHD).exists():
        missing.append(SSHD)
    if systemd:
        missing += [t for t in ("setpriv", "pivot_root", "nsenter") if not shutil.which(t)]
        for path in (SYSTEMD, "/usr/lib/systemd/system/ssh.service"):
            if not Path(path).exists():
                missing.append(path)
    if missing:
        raise TestHostError(
            f"missing {', '.join(missing)}: install Debian's openssh-server, openssh-client, "
            "iproute2 and sudo (make test-deps does)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.testhosts",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start hosts, print the inventory path")
    up.add_argument(
        "--profiles", required=True, help="comma-separated, one host each, e.g. ct200,h200,b200"
    )
    up.add_argument(
        "--systemd",
        default="",
        help="comma-separated host names (<profile>-<n>) that boot systemd as PID 1",
    )
    down = sub.add_parser("down", help="remove hosts")
    which = down.add_mutually_exclusive_group(required=True)
    which.add_argument("--state-dir", type=Path)
    which.add_argument("--stale", action="store_true", help="runs whose owner process is gone")
    which.add_argument("--all", action="store_true", help="every run, kept ones included")
    args = parser.parse_args(argv)
    if args.command == "up":
        profiles = args.profiles.split(",")
        systemd = [name for name in args.systemd.split(",") if name]
        names = None
        if systemd:
            counts: dict[str, int] = {}
            names = []
            for profile in profiles:
                names.append(f"{profile}-{counts.get(profile, 0)}")
                counts[profile] = counts.get(profile, 0) + 1
        cluster = TestHostCluster.up(profiles, names=names, owner_pid=0, systemd=systemd)
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
