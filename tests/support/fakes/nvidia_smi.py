#!/usr/bin/python3
"""A stand-in for `nvidia-smi` that replays a capture taken on a real (or a built) GPU host.

Installed on each test host as /usr/local/bin/nvidia-smi. The capture folder holds what
the real commands printed (see tests/fixtures/gpu-hosts/README.md); invocations that no
capture covers fail loudly instead of inventing output.

Faults: a file /etc/fake-nvidia-smi/fault on the test host holding `no-driver` or
`no-devices` makes every call fail the way the real tool does in that state. `hang` makes
every call hang as nvidia-smi does on a GPU stuck in the driver: the process sleeps and starts
a child that sleeps too and ignores SIGTERM, both with FAKE_NVIDIA_SMI_HANG_MARKER (default
`fake-nvidia-smi-hang`) in their command lines so a test can find any that survive.
`truncated-xml` cuts `-q -x` off in the middle of a GPU record, as a killed or crashed
nvidia-smi leaves it.

Persistence mode: `-pm 0|1` (all GPUs, or those given with `-i`) is kept in
/etc/fake-nvidia-smi/persistence_mode.json (GPU index to Enabled or Disabled), which overrides
the capture in every later answer; tests write that file to start from persistence mode off. A
file /etc/fake-nvidia-smi/persistence_mode.denied makes `-pm` fail as it does without root.
FAKE_NVIDIA_SMI_STATE_DIR moves /etc/fake-nvidia-smi.

Telemetry: `--query-gpu=F1,F2,... --format=csv[,noheader][,nounits] -lms N` (or `--loop-ms=N`)
replays a telemetry capture, one poll (a row per GPU) every N ms with the current time as
timestamp, looping over the capture, until killed (bounded: it exits after
FAKE_NVIDIA_SMI_LOOP_MAX_S, default an hour). The capture is the first of: the file named by
FAKE_NVIDIA_SMI_TELEMETRY; telemetry.csv in the state dir (/etc/fake-nvidia-smi, so a test can
drop one onto a running host); telemetry.csv in the capture folder (beside nvidia-smi-q.xml);
else one idle row per GPU synthesised from the -q -x capture (power, clocks, temperature,
utilization, memory and clock-event reasons as it shows them). A capture file is what
module_utils/benchmark/gpu_telemetry.py --csv writes (docs/measurements/telemetry-h200.csv): a
header line
of field names, then nvidia-smi's noheader,nounits rows. The replay starts at the capture's first
poll with a GPU at 95% of its power limit or more (else the first with a busy GPU), so a short
level sees the settled load, not the capture's idle lead-in and power ramp; the capture's
GPUs are dealt round-robin onto the host's GPUs (a one-GPU capture serves every GPU of an
eight-GPU host), renumbered. The same fields without -lms print one such poll. The capture is
outside input to the fake too: size, row count and line length are bounded and rows of the wrong
width are skipped.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

CAPTURE_ENV = "FAKE_NVIDIA_SMI_CAPTURE"
DEFAULT_CAPTURE = Path(__file__).resolve().parent.parent / "share" / "fake-nvidia-smi"
FAULT_FILE = Path(os.environ.get("FAKE_NVIDIA_SMI_FAULT_FILE", "/etc/fake-nvidia-smi/fault"))
STATE_DIR = Path(os.environ.get("FAKE_NVIDIA_SMI_STATE_DIR", "/etc/fake-nvidia-smi"))
PERSISTENCE_FILE = "persistence_mode.json"
PERSISTENCE_DENIED = "persistence_mode.denied"

# What the real tool prints (and its exit codes) when the driver is absent or sees no GPU.
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n",
    9,
)
NO_DEVICES = ("No devices were found\n", 6)
HANG_MARKER_ENV = "FAKE_NVIDIA_SMI_HANG_MARKER"
# A hang is bounded too: whatever the test does, nothing of the fake outlives ten minutes.
HANG_CHILD = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
HANG_PARENT = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]]); time.sleep(600)"
)

# --query-gpu fields derived from the -q -x capture when query-gpu.csv lacks them:
# field -> (path below <gpu>, unit shown in the csv header and values).
XML_FIELDS = {
    "name": ("product_name", None),
    "uuid": ("uuid", None),
    "serial": ("serial", None),
    "pci.bus_id": ("pci/pci_bus_id", None),
    "memory.total": ("fb_memory_usage/total", "MiB"),
    "memory.used": ("fb_memory_usage/used", "MiB"),
    "memory.free": ("fb_memory_usage/free", "MiB"),
    "persistence_mode": ("persistence_mode", None),
    "pcie.link.gen.max": ("pci/pci_gpu_link_info/pcie_gen/max_link_gen", None),
    "pcie.link.gen.current": ("pci/pci_gpu_link_info/pcie_gen/current_link_gen", None),
    "pcie.link.width.max": ("pci/pci_gpu_link_info/link_widths/max_link_width", None),
    "pcie.link.width.current": ("pci/pci_gpu_link_info/link_widths/current_link_width", None),
    "mig.mode.current": ("mig_mode/current_mig", None),
}


TELEMETRY_ENV = "FAKE_NVIDIA_SMI_TELEMETRY"
TELEMETRY_FILE = "telemetry.csv"
LOOP_MAX_ENV = "FAKE_NVIDIA_SMI_LOOP_MAX_S"
LOOP_MAX_S = 3600.0
TELEMETRY_MAX_BYTES = 16 * 1024 * 1024
TELEMETRY_MAX_ROWS = 200_000
TELEMETRY_MAX_LINE = 2048
# The older name of the reasons field, still accepted by the driver, maps onto the same column.
FIELD_ALIASES = {
    "clocks_throttle_reasons.active": "clocks_event_reasons.active",
    "clocks.current.sm": "clocks.sm",
    "clocks.current.memory": "clocks.mem",
}
# Telemetry fields read from the -q -x capture when no telemetry capture exists.
TELEMETRY_XML = {
    "name": "product_name",
    "power.draw": "gpu_power_readings/average_power_draw",
    "power.limit": "gpu_power_readings/current_power_limit",
    "clocks.sm": "clocks/sm_clock",
    "clocks.max.sm": "max_clocks/sm_clock",
    "clocks.mem": "clocks/mem_clock",
    "temperature.gpu": "temperature/gpu_temp",
    "utilization.gpu": "utilization/gpu_util",
    "memory.used": "fb_memory_usage/used",
}
# -q -x clock-event reason elements -> nvmlClocksEventReasons bits.
REASON_BITS = {
    "clocks_event_reason_gpu_idle": 0x1,
    "clocks_event_reason_applications_clocks_setting": 0x2,
    "clocks_event_reason_sw_power_cap": 0x4,
    "clocks_event_reason_hw_slowdown": 0x8,
    "clocks_event_reason_sync_boost": 0x10,
    "clocks_event_reason_sw_thermal_slowdown": 0x20,
    "clocks_event_reason_hw_thermal_slowdown": 0x40,
    "clocks_event_reason_hw_power_brake_slowdown": 0x80,
    "clocks_event_reason_display_clocks_setting": 0x100,
}


def capture_dir() -> Path:
    return Path(os.environ.get(CAPTURE_ENV, DEFAULT_CAPTURE))


def read_capture(name: str) -> str:
    path = capture_dir() / name
    if not path.is_file():
        raise SystemExit(f"fake nvidia-smi: capture {path} is missing")
    return path.read_text()


def persistence_overrides() -> dict[int, str]:
    path = STATE_DIR / PERSISTENCE_FILE
    if not path.is_file():
        return {}
    return {int(index): mode for index, mode in json.loads(path.read_text()).items()}


def query_xml() -> str:
    """The -q -x capture with the persistence mode that `-pm` set."""
    overrides = persistence_overrides()
    count = iter(range(1_000_000))

    def replace(match: re.Match) -> str:
        index = next(count)
        mode = overrides.get(index, match.group(2))
        return f"{match.group(1)}{mode}{match.group(3)}"

    return re.sub(
        r"(<persistence_mode>)([^<]*)(</persistence_mode>)",
        replace,
        read_capture("nvidia-smi-q.xml"),
    )


def set_persistence(args: list[str]) -> int:
    """`nvidia-smi [-i ID[,ID]] -pm 0|1`, IDs being indexes or PCI bus ids."""
    value = args[args.index("-pm") + 1]
    rows = gpu_rows()
    if "-i" in args:
        wanted = args[args.index("-i") + 1].split(",")
        chosen = [r for r in rows if r["index"] in wanted or r["pci.bus_id"] in wanted]
        if not chosen:
            sys.stdout.write(f"No devices were found matching {args[args.index('-i') + 1]}\n")
            return 6
    else:
        chosen = rows
    if (STATE_DIR / PERSISTENCE_DENIED).exists():
        for row in chosen:
            sys.stdout.write(
                f"Unable to set persistence mode for GPU {row['pci.bus_id']}: "
                "Insufficient Permissions\n"
            )
        sys.stdout.write("Terminating early due to previous errors.\n")
        return 4
    overrides = {str(k): v for k, v in persistence_overrides().items()}
    for row in chosen:
        mode = "Enabled" if value == "1" else "Disabled"
        overrides[row["index"]] = mode
        legacy = " Legacy" if value == "1" else ""
        sys.stdout.write(f"{mode}{legacy} persistence mode for GPU {row['pci.bus_id']}.\n")
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    (STATE_DIR / PERSISTENCE_FILE).write_text(json.dumps(overrides, sort_keys=True) + "\n")
    sys.stdout.write("All done.\n")
    return 0


def p2p_block(kind: str) -> str:
    """One `topo -p2p X` block out of topo-p2p.txt, where each starts with `== topo -p2p X`."""
    blocks: dict[str, list[str]] = {}
    current = None
    for line in read_capture("topo-p2p.txt").splitlines(keepends=True):
        if line.startswith("== topo -p2p "):
            current = line.split()[-1]
            blocks[current] = []
        elif current is not None:
            blocks[current].append(line)
    if kind not in blocks:
        raise SystemExit(f"fake nvidia-smi: no `topo -p2p {kind}` block in the capture")
    return "".join(blocks[kind])


def gpu_rows() -> list[dict[str, str]]:
    """Per GPU, every known field as nvidia-smi's csv shows it, units included."""
    root = ET.fromstring(query_xml())
    driver = root.findtext("driver_version", "")
    rows = []
    for index, gpu in enumerate(root.findall("gpu")):
        row = {
            "index": str(index),
            "driver_version": driver,
            "count": str(len(root.findall("gpu"))),
        }
        for field, (path, _unit) in XML_FIELDS.items():
            value = (gpu.findtext(path) or "").strip()
            if field.startswith("pcie.link.width"):
                value = value.rstrip("x")
            row[field] = value
        rows.append(row)
    csv_path = capture_dir() / "query-gpu.csv"
    if csv_path.is_file():
        # The csv capture is the only source of compute_cap: -q -x does not print it.
        lines = [line for line in csv_path.read_text().splitlines() if line.strip()]
        header = [h.strip().split(" [")[0] for h in lines[0].split(",")]
        for line in lines[1:]:
            values = [v.strip() for v in line.split(",")]
            record = dict(zip(header, values, strict=True))
            rows[int(record["index"])].update(record)
    for index, mode in persistence_overrides().items():
        rows[index]["persistence_mode"] = mode
    return rows


def query_gpu(fields: list[str], fmt: list[str]) -> str:
    rows = gpu_rows()
    units = {field: unit for field, (_path, unit) in XML_FIELDS.items()}
    for field in fields:
        if field not in rows[0]:
            raise SystemExit(
                f'Field "{field}" is not a valid field to query (or the capture lacks it).'
            )
    nounits = "nounits" in fmt
    out = []
    if "noheader" not in fmt:
        out.append(
            ", ".join(f"{f} [{units[f]}]" if units.get(f) and not nounits else f for f in fields)
        )
    for row in rows:
        values = []
        for field in fields:
            value = row[field]
            if nounits and units.get(field):
                value = value.split()[0]
            values.append(value)
        out.append(", ".join(values))
    return "\n".join(out) + "\n"


def telemetry_source() -> Path | None:
    candidates = []
    if os.environ.get(TELEMETRY_ENV):
        candidates.append(Path(os.environ[TELEMETRY_ENV]))
    candidates += [STATE_DIR / TELEMETRY_FILE, capture_dir() / TELEMETRY_FILE]
    return next((path for path in candidates if path.is_file()), None)


def read_telemetry(path: Path) -> tuple[list[str], list[list[str]]]:
    """(field names, rows) of a telemetry capture; rows of the wrong width are skipped."""
    with path.open("rb") as handle:
        data = handle.read(TELEMETRY_MAX_BYTES)
    lines = [
        line.decode("utf-8", "replace").strip()
        for line in data.splitlines()[: TELEMETRY_MAX_ROWS + 1]
    ]
    lines = [line for line in lines if line and len(line) <= TELEMETRY_MAX_LINE]
    if not lines:
        raise SystemExit(f"fake nvidia-smi: telemetry capture {path} is empty")
    header = [FIELD_ALIASES.get(f.strip(), f.strip()) for f in lines[0].split(",")]
    if "index" not in header:
        raise SystemExit(f"fake nvidia-smi: telemetry capture {path} has no index column")
    rows = []
    for line in lines[1:]:
        values = [v.strip() for v in line.split(",")]
        if len(values) == len(header) and values[header.index("index")].isdigit():
            rows.append(values)
    if not rows:
        raise SystemExit(f"fake nvidia-smi: telemetry capture {path} has no rows")
    return header, rows


def xml_telemetry() -> tuple[list[str], list[list[str]]]:
    """One idle poll built from the -q -x capture: what a GPU host shows when nothing runs."""
    root = ET.fromstring(query_xml())
    header = ["timestamp", "index", *TELEMETRY_XML, "clocks_event_reasons.active"]
    rows = []
    for index, gpu in enumerate(root.findall("gpu")):
        row = ["", str(index)]
        for path in TELEMETRY_XML.values():
            value = (gpu.findtext(path) or "[N/A]").strip()
            row.append(value.split()[0] if value and value[0].isdigit() else value)
        bits = 0
        for element in gpu.findall("clocks_event_reasons/*"):
            if (element.text or "").strip() == "Active":
                bits |= REASON_BITS.get(element.tag, 0)
        row.append(f"0x{bits:016x}")
        rows.append(row)
    return header, rows


def telemetry_polls() -> tuple[list[str], list[list[list[str]]]]:
    """The replay's field names and its polls, each a row per host GPU, renumbered."""
    source = telemetry_source()
    header, rows = read_telemetry(source) if source else xml_telemetry()
    index_at = header.index("index")
    polls: list[list[list[str]]] = []
    seen: set[str] = set()
    for row in rows:
        if not polls or row[index_at] in seen:
            polls.append([])
            seen = set()
        polls[-1].append(row)
        seen.add(row[index_at])
    try:
        host_gpus = len(ET.fromstring(query_xml()).findall("gpu"))
    except (SystemExit, ET.ParseError):
        host_gpus = 0
    dealt = []
    for poll in polls:
        count = host_gpus or len(poll)
        dealt.append(
            [
                [str(gpu) if i == index_at else v for i, v in enumerate(poll[gpu % len(poll)])]
                for gpu in range(count)
            ]
        )
    start = steady_poll(header, dealt)
    if start is None and "utilization.gpu" in header:
        at = header.index("utilization.gpu")
        start = next((n for n, poll in enumerate(dealt) if any(busy(r[at]) for r in poll)), None)
    start = start or 0
    return header, dealt[start:] + dealt[:start]


def busy(value: str) -> bool:
    return value.replace(".", "", 1).isdigit() and float(value) > 0


def steady_poll(header: list[str], polls) -> int | None:
    """The first poll with a GPU drawing 95% of its power limit or more: where a load has
    settled (power.draw is a one-second average that trails a load's start by about two)."""
    if "power.draw" not in header or "power.limit" not in header:
        return None
    draw, limit = header.index("power.draw"), header.index("power.limit")
    for n, poll in enumerate(polls):
        for row in poll:
            settled = busy(row[draw]) and busy(row[limit])
            if settled and float(row[draw]) >= 0.95 * float(row[limit]):
                return n
    return None


def telemetry_lines(fields: list[str], fmt: list[str], header: list[str], poll) -> str:
    now = datetime.datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
    out = []
    for row in poll:
        values = []
        for field in fields:
            column = FIELD_ALIASES.get(field, field)
            values.append(now if column == "timestamp" else row[header.index(column)])
        out.append(", ".join(values))
    return "".join(line + "\n" for line in out)


def telemetry_header(fields: list[str], fmt: list[str]) -> str:
    # Units are left out of this header: the capture keeps none (it was taken with nounits).
    return "" if "noheader" in fmt else ", ".join(fields) + "\n"


def check_telemetry_fields(fields: list[str], header: list[str]) -> None:
    for field in fields:
        if FIELD_ALIASES.get(field, field) not in header:
            raise SystemExit(f'Field "{field}" is not a valid field to query.')


def loop_interval_ms(args: list[str]) -> int | None:
    for n, arg in enumerate(args):
        value = None
        if arg in ("-lms", "--loop-ms") and n + 1 < len(args):
            value = args[n + 1]
        elif arg.startswith("--loop-ms="):
            value = arg.split("=", 1)[1]
        if value is not None:
            if not value.isdigit() or not 1 <= int(value) <= 3_600_000:
                raise SystemExit(f"fake nvidia-smi: bad loop interval {value!r}")
            return int(value)
    return None


def replay(fields: list[str], fmt: list[str], interval_ms: int) -> int:
    header, polls = telemetry_polls()
    check_telemetry_fields(fields, header)
    limit = float(os.environ.get(LOOP_MAX_ENV, LOOP_MAX_S))
    start = time.monotonic()
    due = start
    count = 0
    try:
        sys.stdout.write(telemetry_header(fields, fmt))
        while time.monotonic() - start < limit:
            sys.stdout.write(telemetry_lines(fields, fmt, header, polls[count % len(polls)]))
            sys.stdout.flush()
            count += 1
            due += interval_ms / 1000
            time.sleep(max(0.0, due - time.monotonic()))
    except (BrokenPipeError, KeyboardInterrupt):
        # The reader went away: what a killed sampler leaves; exit quietly like the real tool.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0


def list_gpus() -> str:
    return "".join(
        f"GPU {row['index']}: {row['name']} (UUID: {row['uuid']})\n" for row in gpu_rows()
    )


def hang() -> None:
    """Become a process that never answers, with a child that outlives a plain SIGTERM."""
    marker = os.environ.get(HANG_MARKER_ENV, "fake-nvidia-smi-hang")
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-c", HANG_PARENT, HANG_CHILD, marker])  # noqa: S606


def truncated_xml() -> str:
    """-q -x cut off inside the second GPU's record (inside the first on one GPU)."""
    xml = query_xml()
    starts = [m.start() for m in re.finditer(r"<gpu id=", xml)]
    start = starts[1] if len(starts) > 1 else starts[0]
    cut = xml.index("<fb_memory_usage>", start)
    return xml[:cut]


def query_text() -> str:
    """`nvidia-smi -q`: the -q -x capture in the plain layout, `Name : value` indented by
    depth, one block per GPU, as the real one prints the same tree."""
    root = ET.fromstring(query_xml())
    lines = ["", "=" * 14 + "NVSMI LOG" + "=" * 14, ""]

    def walk(element, depth: int) -> None:
        for child in element:
            label = child.tag.replace("_", " ").title()
            text = (child.text or "").strip()
            if len(child):
                lines.append(f"{'    ' * depth}{label}")
                walk(child, depth + 1)
            else:
                lines.append(f"{'    ' * depth}{label:<40}: {text}")

    for child in root:
        if child.tag == "gpu":
            lines += ["", f"GPU {child.get('id', '')}"]
            walk(child, 1)
        elif not len(child):
            lines.append(f"{child.tag.replace('_', ' ').title():<44}: {(child.text or '').strip()}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if FAULT_FILE.is_file():
        fault = FAULT_FILE.read_text().strip()
        if fault == "hang":
            hang()
        if fault == "truncated-xml":
            if sorted(argv) == ["-q", "-x"]:
                sys.stdout.write(truncated_xml())
                return 0
            fault = ""
        if fault:
            message, code = {"no-driver": NO_DRIVER, "no-devices": NO_DEVICES}.get(
                fault, (f"fake nvidia-smi: unknown fault {fault!r}\n", 2)
            )
            sys.stdout.write(message)
            return code

    args = list(argv)
    if sorted(args) in (["-q", "-x"], ["--query", "--xml-format"], ["-qx"]):
        sys.stdout.write(query_xml())
        return 0
    if args in (["-q"], ["--query"]):
        sys.stdout.write(query_text())
        return 0
    if args in (["topo", "-m"], ["topo", "--matrix"]):
        sys.stdout.write(read_capture("topo-m.txt"))
        return 0
    if len(args) == 3 and args[:2] == ["topo", "-p2p"]:
        sys.stdout.write(p2p_block(args[2]))
        return 0
    if "-pm" in args and args[-1] in ("0", "1") and len(args) in (2, 4):
        return set_persistence(args)
    if args in (["-L"], ["--list-gpus"]):
        sys.stdout.write(list_gpus())
        return 0
    query = [a for a in args if a.startswith("--query-gpu=")]
    fmt = [a for a in args if a.startswith("--format=")]
    if query and fmt:
        fields = [f.strip() for f in query[0].split("=", 1)[1].split(",")]
        formats = fmt[0].split("=", 1)[1].split(",")
        interval = loop_interval_ms(args)
        if interval is not None and len(args) in (3, 4):
            return replay(fields, formats, interval)
        if len(args) == 2:
            try:
                known = gpu_rows()[0]
            except SystemExit:
                known = {}  # no -q -x capture: only a telemetry capture can answer
            if known and all(field in known for field in fields):
                sys.stdout.write(query_gpu(fields, formats))
                return 0
            header, polls = telemetry_polls()
            check_telemetry_fields(fields, header)
            sys.stdout.write(telemetry_header(fields, formats))
            sys.stdout.write(telemetry_lines(fields, formats, header, polls[0]))
            return 0
    sys.stderr.write(
        f"fake nvidia-smi: no capture answers `nvidia-smi {' '.join(args)}`; "
        "supported: -q, -q -x, topo -m, topo -p2p X, -L, --query-gpu=... --format=csv[,...] "
        "[-lms N], [-i ID] -pm 0|1\n"
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
