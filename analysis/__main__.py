"""python -m analysis report RESULTS_DIR [--out DIR] | compare RUN_A RUN_B [--out DIR]
[--require-comparable]"""

from __future__ import annotations

import argparse
import sys

from ansible.module_utils.contract.secrets import CONTROLLER_SECRET_ENV

from analysis import comparability
from analysis.bundle import DEFAULT_MAX_BYTES as BUNDLE_MAX_BYTES
from analysis.bundle import DEFAULT_MAX_FILE_BYTES as BUNDLE_MAX_FILE_BYTES
from analysis.bundle import BundleError, bundle
from analysis.output import OutputError, terminal_text
from analysis.report import report
from analysis.report_compare import compare
from analysis.results import DEFAULT_MAX_FILE_BYTES, ResultsError, model_title
from analysis.tables import DEFAULT_BAND_EDGES, SloError, parse_slo

MAX_HOST_LINES = 6
# compare --require-comparable when the runs differ in a way that makes them not comparable
# (2 is bad input).
NOT_COMPARABLE_EXIT = 3


def edges(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers like 1,8,32,128, got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values) or list(values) != sorted(set(values)):
        raise argparse.ArgumentTypeError(f"expected ascending levels of at least 1, got {text!r}")
    return values


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def size(text: str) -> int:
    """Bytes: 4294967296, or with a binary unit, 512M, 4G, 1T (K, M, G, T; KiB etc. too)."""
    number = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = number[-1:] if number[-1:] in _UNITS else ""
    digits = number[: len(number) - len(unit)]
    if not digits.isdecimal() or len(digits) > 15 or int(digits) < 1:
        raise argparse.ArgumentTypeError(
            f"expected a size in bytes like 2147483648, 512M or 4G, got {text!r}"
        )
    return int(digits) * _UNITS[unit]


def slo(text: str) -> dict[str, float]:
    try:
        return parse_slo(text)
    except SloError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def level(text: str) -> int:
    if not text.strip().isdecimal() or len(text.strip()) > 7 or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a concurrency level like 64, got {text!r}")
    return int(text)


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="python -m analysis",
        description="Tables, plots and an HTML report from benchmark_kimi.yml results.",
    )
    commands = main.add_subparsers(dest="command", required=True)
    common = _common_args()
    _report_args(commands, common)
    _bundle_args(commands)
    _compare_args(commands, common)
    return main


def _common_args() -> argparse.ArgumentParser:
    """The options report and compare share."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--reference",
        help="config speedups are measured against (default: run.json's, else ar)",
    )
    common.add_argument(
        "--strict",
        action="store_true",
        help="parse every byte of every level file (slower; the default checks the fields used)",
    )
    common.add_argument("--workers", type=int, help="processes reading files (default: CPUs)")
    common.add_argument(
        "--max-file-bytes",
        type=size,
        default=DEFAULT_MAX_FILE_BYTES,
        metavar="SIZE",
        help="largest file read, in bytes or with K, M, G, T (default 2G); a larger one is "
        "refused by name, as are FIFOs, devices and sockets (links to regular files are read)",
    )
    common.add_argument(
        "--label",
        default="",
        help="a word that leads the title and goes into every plot's image, title and caption, "
        "e.g. SIMULATED for results from the simulator",
    )
    common.add_argument(
        "--slo",
        type=slo,
        metavar="KEY=MS,...",
        help="service level objectives, e.g. ttft_ms_p99=2000,tpot_ms_p99=33 (KEY "
        "<ttft|itl|tpot|e2e>_ms_<p50|p90|p99>, VALUE milliseconds): adds slo_met and "
        "goodput_requests_per_s, and recommends only configs that meet every one",
    )
    return common


def _report_args(commands, common: argparse.ArgumentParser) -> None:
    one = commands.add_parser(
        "report",
        parents=[common],
        help="analyse one run",
        description="Analyse one run's results (results/<run_id>, or any folder inside it).",
    )
    one.add_argument("results_dir", metavar="RESULTS_DIR")
    one.add_argument(
        "--out",
        metavar="DIR",
        help="output folder; must not exist or be empty (default: RESULTS_DIR/report, or "
        "report-2, report-3, ... when that holds files)",
    )
    one.add_argument(
        "--bands",
        type=edges,
        default=DEFAULT_BAND_EDGES,
        metavar="N,N,...",
        help="upper edges of the concurrency bands the recommendation is made for "
        f"(default {','.join(map(str, DEFAULT_BAND_EDGES))}: 1, 2-8, 9-32, 33-128, 129+)",
    )
    one.add_argument(
        "--cdf-concurrency",
        type=level,
        metavar="N",
        help="the concurrency level the TTFT and ITL CDFs are drawn at (default: the highest)",
    )


def _bundle_args(commands) -> None:
    pack = commands.add_parser(
        "bundle",
        help="pack a run for sharing, secrets scrubbed",
        description="Pack a run (run.json, level files, lossless, status, api-check, debug/, "
        "reports) into a .tar.gz with every file, gzip members too, scrubbed of secrets: the "
        f"values of {', '.join(CONTROLLER_SECRET_ENV[:-1])} and {CONTROLLER_SECRET_ENV[-1]} when "
        "set, of --secret-env variables and --secret-file lines, their base64 forms and "
        "digests, and hf_ tokens, bearer headers, api_key values and URL passwords.",
    )
    pack.add_argument("results_dir", metavar="RESULTS_DIR")
    pack.add_argument(
        "--out", required=True, metavar="FILE.tar.gz", help="the archive; never replaced"
    )
    pack.add_argument(
        "--secret-env",
        action="append",
        default=[],
        metavar="VAR",
        help="an environment variable whose value is masked too (repeatable; must be set)",
    )
    pack.add_argument("--secret-file", metavar="FILE", help="a file of secrets to mask, one a line")
    pack.add_argument(
        "--max-file-bytes",
        type=size,
        default=BUNDLE_MAX_FILE_BYTES,
        metavar="SIZE",
        help="largest file packed, before compression (default 512M); a larger one is left "
        "out and listed",
    )
    pack.add_argument(
        "--max-bytes",
        type=size,
        default=BUNDLE_MAX_BYTES,
        metavar="SIZE",
        help="most bytes packed in all, before compression (default 8G)",
    )


def _compare_args(commands, common: argparse.ArgumentParser) -> None:
    two = commands.add_parser(
        "compare",
        parents=[common],
        help="compare two runs",
        description="Run B against run A: the same configs, prompt sets and levels side by side.",
    )
    two.add_argument("run_a", metavar="RUN_A")
    two.add_argument("run_b", metavar="RUN_B")
    two.add_argument(
        "--out",
        metavar="DIR",
        help="output folder; must not exist or be empty (default: RUN_B/compare-<RUN_A name>)",
    )
    two.add_argument(
        "--require-comparable",
        action="store_true",
        help=f"exit {NOT_COMPARABLE_EXIT} (after writing the output) when the runs differ in "
        "anything that makes them not comparable (settings, prompts, weights, runtime, "
        "launch, driver; not_comparable warnings); GPU model, interconnect, attention "
        "backend and model differences are expected and pass",
    )


def _say(*parts, **options) -> None:
    """print() for the summary's lines, whose host, prompt set and config names come from the
    results (outside input): a control character (a terminal escape that would repaint the
    screen) is shown as '?'."""
    print(*(terminal_text(str(part)) for part in parts), **options)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "bundle":
        return _run_bundle(args)
    try:
        outcome = _run_report(args) if args.command == "report" else _run_compare(args)
    except (ResultsError, OutputError) as error:
        _say(f"analysis {args.command}: {error}", file=sys.stderr)
        return 2
    _print_picks(outcome, args.slo)
    _print_ddtree(outcome)
    _print_warnings(outcome)
    if args.command != "compare":
        return 0
    return _comparability_exit(outcome, args.require_comparable)


def _read_options(args) -> dict:
    """The keywords report and compare take alike, from the options they share."""
    return {
        "reference": args.reference,
        "strict": args.strict,
        "workers": args.workers,
        "label": args.label,
        "max_file_bytes": args.max_file_bytes,
        "slo": args.slo,
    }


def _run_report(args):
    return report(
        args.results_dir,
        out=args.out,
        band_edges=args.bands,
        cdf_concurrency=args.cdf_concurrency,
        **_read_options(args),
    )


def _run_compare(args):
    return compare(args.run_a, args.run_b, out=args.out, **_read_options(args))


def _of_kind(outcome, kind: str) -> list[dict]:
    return [w for w in outcome.warnings if w["kind"] == kind]


def _print_picks(outcome, slo: dict[str, float] | None) -> None:
    """Where the report is, what it read, the SLOs and the recommended config per host."""
    _say(
        f"{outcome.html} ({outcome.levels} levels, {outcome.records} request records from "
        f"{outcome.inputs} files in {outcome.seconds['total']:.1f} s)"
    )
    if slo:
        _say(f"  SLOs: {', '.join(f'{k} <= {v:g} ms' for k, v in slo.items())}")
    hosts: dict[str, list[str]] = {}
    for pick in outcome.picks:
        hosts.setdefault(pick.host, []).append(
            f"{pick.band}: {pick.config or 'none'}{_goodput(pick)}"
        )
    for host, picks in list(hosts.items())[:MAX_HOST_LINES]:
        _say(f"  recommended on {host} by concurrency - {', '.join(picks)}")
    if len(hosts) > MAX_HOST_LINES:
        _say(f"  ... and {len(hosts) - MAX_HOST_LINES} more hosts: see the report")


def _goodput(pick) -> str:
    """' (goodput 3.2 requests/s, 95% 2.9-3.5)' with SLOs, where the pick has one."""
    if pick.goodput_requests_per_s is None:
        return ""
    interval = (
        f", 95% {pick.goodput_ci95[0]:.3g}-{pick.goodput_ci95[1]:.3g}" if pick.goodput_ci95 else ""
    )
    return f" (goodput {pick.goodput_requests_per_s:.3g} requests/s{interval})"


def _print_ddtree(outcome) -> None:
    """The DDTree budget collapses and, where the report diagnosed one, its verdict."""
    collapses = _of_kind(outcome, "ddtree_budget_collapse")
    if collapses:
        _say(
            f"  DDTree accepted tokens per step collapse at {len(collapses)} host / prompt set / "
            "level(s): see the ddtree_budget_collapse warnings and the decomposition plot"
        )
    if outcome.diagnosis:
        _say(
            "  DDTree collapse diagnosis - "
            + "; ".join(
                f"{side.upper()}: {found['run']} ({model_title(found['model'])}): "
                f"{found['verdict']}"
                for side, found in outcome.diagnosis.items()
            )
        )


def _print_warnings(outcome) -> None:
    """A line for each kind of warning worth a look on the terminal, then the counts."""
    throttled = _of_kind(outcome, "gpu_throttled")
    if throttled:
        _say(
            f"  GPU clocks held down (power cap, thermal or hardware slowdown) at "
            f"{len({w['where'] for w in throttled})} level(s): see the gpu_throttled warnings"
        )
    print_predicted(outcome)
    thin = _of_kind(outcome, "under_filled")
    if thin:
        _say(
            f"  {len(thin)} under-filled level(s): fewer unique prompts than the level wanted, "
            "so their throughput understates a full level: see the under_filled notes"
        )
    unfinished = _of_kind(outcome, "incomplete_run")
    if unfinished:
        _say(
            f"  incomplete run: {len(unfinished)} incomplete_run warnings (run.json without "
            "ended_at, or configs and levels it plans that left no file): see the report"
        )
    gate = {
        kind: len(_of_kind(outcome, kind))
        for kind in ("accuracy_below_floor", "accuracy_below_ar", "api_check_failed")
    }
    if any(gate.values()):
        _say(
            "  quality gate: "
            + ", ".join(f"{count} {kind}" for kind, count in gate.items() if count)
            + " (a broken deployment that losslessness cannot see): see the report"
        )
    counts = {s: sum(w["severity"] == s for w in outcome.warnings) for s in ("error", "warning")}
    if counts["error"] or counts["warning"]:
        _say(f"  {counts['error']} errors and {counts['warning']} warnings: see the report")


def _comparability_exit(outcome, require_comparable: bool) -> int:
    """compare's comparability line; NOT_COMPARABLE_EXIT under --require-comparable when the
    runs are not comparable, else 0."""
    differences = comparability.counts(outcome.warnings)
    _say(
        f"  comparability: {differences[comparability.NOT_COMPARABLE]} not_comparable, "
        f"{differences[comparability.EXPECTED]} expected_difference (see the Comparability "
        "section)"
    )
    if require_comparable and differences[comparability.NOT_COMPARABLE]:
        _say(
            f"analysis compare: --require-comparable: the runs are not comparable "
            f"({differences[comparability.NOT_COMPARABLE]} not_comparable warnings)",
            file=sys.stderr,
        )
        return NOT_COMPARABLE_EXIT
    return 0


def print_predicted(outcome) -> None:
    """The speed model's lines: how far the step times were from it, the slow levels and
    their likely parts, the DDTree sweeps' verdicts."""
    rows = (outcome.predicted or {}).get("rows") or []
    ratios = sorted(r["step_ms_ratio"] for r in rows if r.get("step_ms_ratio") is not None)
    if ratios:
        middle = ratios[len(ratios) // 2]
        _say(
            f"  measured against predicted: {len(ratios)} levels, step time {ratios[0]:.2f} to "
            f"{ratios[-1]:.2f} times the speed model's (median {middle:.2f}): see predicted.csv"
        )
    slow = [w for w in outcome.warnings if w["kind"] == "slower_than_predicted"]
    if slow:
        parts: dict[str, int] = {}
        for warning in slow:
            for part in warning.get("likely") or ["unexplained"]:
                parts[part] = parts.get(part, 0) + 1
        named = ", ".join(f"{part} {count}" for part, count in sorted(parts.items()))
        _say(
            f"  {len(slow)} level(s) more than 25% slower than the speed model predicts "
            f"(likely: {named}): see the slower_than_predicted warnings"
        )
    shapes = (outcome.predicted or {}).get("shapes") or []
    if shapes:
        verdicts: dict[str, int] = {}
        for shape in shapes:
            verdicts[shape["verdict"]] = verdicts.get(shape["verdict"], 0) + 1
        _say(
            "  DDTree budget diagnosis: "
            + ", ".join(
                f"{count} {verdict.replace('_', ' ')}" for verdict, count in verdicts.items()
            )
            + " (ddtree_diagnosis.csv)"
        )


def _run_bundle(args) -> int:
    try:
        done = bundle(
            args.results_dir,
            args.out,
            secret_env=args.secret_env,
            secret_file=args.secret_file,
            max_file_bytes=args.max_file_bytes,
            max_bytes=args.max_bytes,
        )
    except BundleError as error:
        _say(f"analysis bundle: {error}", file=sys.stderr)
        return 2
    _say(
        f"{done.out}: {len(done.members)} files ({done.bytes} bytes before compression); "
        f"{done.masked} values masked ({done.secrets} secrets given, and the patterns)"
    )
    for path, why in done.left_out[:MAX_HOST_LINES]:
        _say(f"  left out {path}: {why}")
    if len(done.left_out) > MAX_HOST_LINES:
        _say(f"  ... and {len(done.left_out) - MAX_HOST_LINES} more: see BUNDLE.json inside")
    return 0


if __name__ == "__main__":
    sys.exit(main())
