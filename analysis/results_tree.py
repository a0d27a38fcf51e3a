"""The whole tree: finding its files, reading the levels (in worker processes when the tree is
big) and the files beside them, and the checks across files (one schema version, one file per
level)."""

from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from ansible.module_utils.contract.level import API_CHECK_FILE, LEVEL_FILE, SUPPORTED_SCHEMAS
from ansible.module_utils.contract.names import config_order

from analysis.results_level import read_level
from analysis.results_read import DEFAULT_MAX_FILE_BYTES, read_regular
from analysis.results_schema import level_validator
from analysis.results_side import read_small
from analysis.results_types import Level, Results, ResultsError
from analysis.results_values import show

# Five checks of a few short strings each: a few kilobytes. Anything far larger is not one.
API_CHECK_BYTES = 1 << 20
REPORT_KIND = "analysis.report"
MAX_DEPTH = 8  # run/host/config/prompt set/c<N>.json is 4 below a run; room for a parent
MAX_FILES = 200_000
# Worker processes pay off only on trees big enough to amortise starting them.
PARALLEL_BYTES = 32 << 20
# Report folders are recognised by their report.json; a real one is a few megabytes at most.
REPORT_JSON_BYTES = 64 << 20


# -- discovery -------------------------------------------------------------------------


def discover(root: Path) -> dict[str, list[Path]]:
    """Level, lossless, status and run files under root, skipping hidden folders and the
    analysis's own reports. Linked folders are followed (a run spread over disks), each real
    folder once, so a link back up the tree is no loop."""
    found: dict[str, list[Path]] = {
        "level": [],
        "lossless": [],
        "status": [],
        "run": [],
        "api_check": [],
    }
    count = 0
    base_depth = len(root.parts)
    seen: set[tuple[int, int]] = set()
    for folder, dirs, files in os.walk(root, followlinks=True):
        here = Path(folder)
        depth = len(here.parts) - base_depth
        try:
            info = os.stat(here)
        except OSError:
            dirs[:] = []
            continue
        if (info.st_dev, info.st_ino) in seen:
            dirs[:] = []
            continue
        seen.add((info.st_dev, info.st_ino))
        if depth >= MAX_DEPTH or (here != root and is_report_dir(here, files)):
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            count += 1
            if count > MAX_FILES:
                raise ResultsError(
                    [f"{root}: more than {MAX_FILES} files: point at one run's folder"], root
                )
            if LEVEL_FILE.match(name):
                found["level"].append(here / name)
            elif name == "lossless.json":
                found["lossless"].append(here / name)
            elif name == "status.json":
                found["status"].append(here / name)
            elif name == "run.json":
                found["run"].append(here / name)
            elif name == API_CHECK_FILE:
                found["api_check"].append(here / name)
    return found


def is_report_dir(folder: Path, files: list[str]) -> bool:
    if "report.json" not in files:
        return False
    data, problem = read_regular(folder / "report.json", "report.json", REPORT_JSON_BYTES)
    if problem:
        return False
    try:
        return json.loads(data).get("kind", "").startswith("analysis.")
    except (ValueError, AttributeError, RecursionError):
        return False


# -- the whole tree --------------------------------------------------------------------


def _config_dir(root: Path, file: Path, config: str) -> Path | None:
    """The folder named after the config, at most two levels above the file, inside root."""
    for folder in [file.parent, *file.parent.parents][:2]:
        if folder.name == config and (folder == root or root in folder.parents):
            return folder
    return None


def _host_of(root: Path, config_dir: Path | None) -> str | None:
    """The folder holding the config's folder, when that is inside root (root a run's or a
    parent folder); None when root is a host's own folder or the layout has no host level."""
    if config_dir is not None and config_dir != root and config_dir.parent != root:
        return config_dir.parent.name if root in config_dir.parent.parents else None
    return None


def load(
    root: Path | str,
    strict: bool = False,
    workers: int | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> Results:
    """Read and validate every result file under root; ResultsError lists every problem.
    Only regular files (or links to one) of at most max_file_bytes each are read."""
    root = Path(root)
    if not root.is_dir():
        raise ResultsError([f"{root}: not a folder of benchmark results"])
    found = discover(root)
    if not found["level"]:
        raise ResultsError(
            [
                f"{root}: no level files (c<N>.json, r<R>.json) found: point at a run's folder, "
                "results/<run_id>, as benchmark_kimi.yml lands it"
            ],
            root,
        )
    tasks = [(str(p), str(p.relative_to(root)), strict, max_file_bytes) for p in found["level"]]
    level_validator()  # compiled once, here, for the worker processes to inherit
    levels, versions, problems, total = _read_levels(root, tasks, _read_all(tasks, workers))
    problems += _schema_problems(versions)
    problems += _duplicate_problems(levels)
    lossless, issues = _read_lossless(root, found["lossless"], levels, max_file_bytes)
    problems += issues
    status, issues = _read_status(root, found["status"], levels, max_file_bytes)
    problems += issues
    api_checks, issues = _read_api_checks(root, found["api_check"], levels, max_file_bytes)
    problems += issues
    run, run_dir, issues = _read_run(root, found["run"], max_file_bytes)
    problems += issues
    if problems:
        raise ResultsError(problems, root)
    levels.sort(key=_level_order)
    return Results(
        root=root,
        levels=levels,
        lossless=lossless,
        status=status,
        run=run,
        api_checks=api_checks,
        files=len(tasks),
        bytes_read=total,
        run_dir=run_dir,
    )


def _read_levels(root: Path, tasks: list[tuple], outcomes: list[tuple]) -> tuple:
    """(levels, (file, schema version) per level read, problems, bytes read) from the level
    files' outcomes, in the tasks' order."""
    problems: list[str] = []
    levels: list[Level] = []
    versions: list[tuple[str, int]] = []
    total = 0
    for (path, rel, *_options), (reduced, issues, size) in zip(tasks, outcomes, strict=True):
        total += size
        problems += issues
        if reduced is None:
            continue
        versions.append((rel, reduced["schema_version"]))
        if not reduced.get("unsupported"):
            levels.append(_level(root, Path(path), rel, reduced))
    return levels, versions, problems, total


def _level(root: Path, file: Path, rel: str, reduced: dict) -> Level:
    config_dir = _config_dir(root, file, reduced["config"])
    host = _host_of(root, config_dir) or reduced["provenance"].get("host") or root.resolve().name
    return Level(
        path=rel,
        host=host,
        config=reduced["config"],
        prompt_set=reduced["prompt_set"],
        concurrency=reduced["concurrency"],
        schema_version=reduced["schema_version"],
        run_id=reduced["run_id"],
        summary=reduced["summary"],
        client=reduced["client"],
        crashed=reduced["crashed"],
        settings=reduced["settings"],
        provenance=reduced["provenance"],
        accept=reduced["accept"],
        accept_tokens=reduced["accept_tokens"],
        context_tokens_mean=reduced["context_tokens_mean"],
        context_skipped=reduced["context_skipped"],
        records=reduced["records"],
        ttft=reduced["ttft"],
        tpot=reduced["tpot"],
        e2e=reduced["e2e"],
        request_rate=reduced["request_rate"],
        arrival=reduced["arrival"],
        repeat=reduced["repeat"],
        repeats=reduced["repeats"],
        fill=reduced["fill"],
        workload=reduced["workload"],
        fleet=reduced["fleet"],
    )


def _duplicate_problems(levels: list[Level]) -> list[str]:
    """A second file for a level already read (two runs under one folder)."""
    problems = []
    seen: dict[tuple, str] = {}
    for level in levels:
        key = (
            level.host,
            level.config,
            level.prompt_set,
            level.concurrency,
            level.request_rate,
            level.repeat,
        )
        if key in seen:
            rate = f", request rate {level.request_rate:g}" if level.request_rate else ""
            again = f", repeat {level.repeat}" if level.repeat > 1 else ""
            problems.append(
                f"{level.path}: concurrency: a second level file for host {key[0]}, config "
                f"{key[1]}, prompt set {key[2]}, concurrency {key[3]}{rate}{again} (the first "
                f"is {seen[key]}): point at one run's folder, or use `compare` for two runs"
            )
        else:
            seen[key] = level.path
    return problems


def _read_lossless(root: Path, paths: list[Path], levels: list[Level], limit: int) -> tuple:
    """({host: lossless.json}, problems)."""
    lossless: dict[str, dict] = {}
    problems: list[str] = []
    for path in paths:
        rel = str(path.relative_to(root))
        report, issues = read_small(path, rel, "lossless", limit)
        problems += issues
        if not issues:
            # Beside the config folders: its folder is the host's.
            host = path.parent.name if path.parent != root else _root_host(root, levels)
            lossless[host] = report
    return lossless, problems


def _read_status(root: Path, paths: list[Path], levels: list[Level], limit: int) -> tuple:
    """({(host, config): status.json}, problems)."""
    status: dict[tuple[str, str], dict] = {}
    problems: list[str] = []
    for path in paths:
        rel = str(path.relative_to(root))
        record, issues = read_small(path, rel, "status", limit)
        if issues:
            problems += issues
            continue
        config = record.get("config") if isinstance(record.get("config"), str) else None
        config = config or path.parent.name
        if record.get("status") not in ("ok", "failed"):
            problems.append(
                f"{rel}: status: expected 'ok' or 'failed', found {show(record.get('status'))}"
            )
            continue
        status[(_host_of(root, path.parent) or _root_host(root, levels), config)] = record
    return status, problems


def _read_api_checks(root: Path, paths: list[Path], levels: list[Level], limit: int) -> tuple:
    """({(host, config): api-check.json}, problems)."""
    api_checks: dict[tuple[str, str], dict] = {}
    problems: list[str] = []
    for path in paths:
        rel = str(path.relative_to(root))
        record, issues = read_small(path, rel, "api_check", min(limit, API_CHECK_BYTES))
        if issues:
            problems += issues
            continue
        config = record.get("config") or path.parent.name
        api_checks[(_host_of(root, path.parent) or _root_host(root, levels), config)] = record
    return api_checks, problems


def _read_run(root: Path, paths: list[Path], limit: int) -> tuple:
    """(run.json, its folder relative to root, problems): the one at root, else the first.

    A run.json that cannot be read is an error, not a file to pass over: it names the
    reference config and the plan the incomplete_run warnings check, and a report made
    without it would silently measure against ar and call an interrupted run complete."""
    run: dict = {}
    run_dir: Path | None = None
    problems: list[str] = []
    for path in paths:
        record, issues = read_small(path, str(path.relative_to(root)), "run", limit)
        problems += issues
        if record is not None and (path.parent == root or run_dir is None):
            run, run_dir = record, path.parent.relative_to(root)
    return run, run_dir, problems


def _level_order(level: Level) -> tuple:
    return (
        level.host,
        level.prompt_set,
        config_order(level.config),
        level.request_rate is not None,
        level.request_rate or 0.0,
        level.concurrency,
        level.repeat,
    )


def _root_host(root: Path, levels: list[Level]) -> str:
    hosts = {lv.host for lv in levels}
    return next(iter(hosts)) if len(hosts) == 1 else root.resolve().name


def _schema_problems(versions: list[tuple[str, int]]) -> list[str]:
    """Files of more than one schema version, and versions this analysis does not read."""
    by_version: dict[int, list[str]] = {}
    for path, version in versions:
        by_version.setdefault(version, []).append(path)
    problems = []
    if len(by_version) > 1:
        # The most common version is the norm; every other file is named.
        norm = max(by_version, key=lambda v: len(by_version[v]))
        example = by_version[norm][0]
        others = len(by_version[norm]) - 1
        for version, paths in sorted(by_version.items()):
            if version == norm:
                continue
            for path in paths:
                problems.append(
                    f"{path}: schema_version: {version}, while {example} (and {others} other "
                    f"files) have {norm}: results written by different kit versions cannot be "
                    "mixed in one report; analyse each run on its own, or use `compare`"
                )
    for version, paths in sorted(by_version.items()):
        if version not in SUPPORTED_SCHEMAS:
            problems.append(
                f"{paths[0]}: schema_version: {version} is not one this analysis reads "
                f"({', '.join(map(str, SUPPORTED_SCHEMAS))}); update the kit"
                + (f" ({len(paths) - 1} more files like it)" if len(paths) > 1 else "")
            )
    return problems


def _read_one(task: tuple) -> tuple:
    return read_level(*task)


def _read_all(tasks: list[tuple], workers: int | None) -> list[tuple]:
    workers = workers if workers is not None else (os.cpu_count() or 1)
    size = sum(_size(t[0]) for t in tasks)
    if workers <= 1 or len(tasks) < 4 or size < PARALLEL_BYTES:
        return [_read_one(task) for task in tasks]
    chunk = max(1, len(tasks) // (workers * 8))
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks))) as pool:
        return list(pool.map(_read_one, tasks, chunksize=chunk))


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
