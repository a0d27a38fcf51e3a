"""What reading a results tree gives: the levels, the other files beside them, and the error
that lists every problem found."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from pathlib import Path

MAX_PROBLEMS = 60


class ResultsError(Exception):
    """The results cannot be analysed; `problems` holds one 'file: field: what' line each."""

    def __init__(self, problems: list[str], root: Path | None = None):
        self.problems = problems
        self.root = root
        shown = problems[:MAX_PROBLEMS]
        more = len(problems) - len(shown)
        where = f" under {root}" if root else ""
        lines = [f"{len(problems)} problem(s) with the results{where}:"]
        lines += [f"  {p}" for p in shown]
        if more:
            lines.append(f"  ... and {more} more")
        super().__init__("\n".join(lines))


@dataclass
class Level:
    """One c<N>.json, reduced to what the analysis uses."""

    path: str  # relative to the results root
    host: str
    config: str
    prompt_set: str
    concurrency: int
    schema_version: int
    run_id: str
    summary: dict
    client: dict
    crashed: bool
    settings: dict
    provenance: dict
    # Per request: accept length and output tokens of the speculative requests that succeeded.
    accept: array = field(default_factory=lambda: array("d"))
    accept_tokens: array = field(default_factory=lambda: array("d"))
    records: int = 0
    # Per request that succeeded, in record order: its TTFT, mean TPOT and E2E latency in ms
    # (NaN where the record has none: a one-token answer has no TPOT). Doubles, 24 bytes a
    # request, for goodput under SLOs and the TTFT CDF.
    ttft: array = field(default_factory=lambda: array("d"))
    tpot: array = field(default_factory=lambda: array("d"))
    e2e: array = field(default_factory=lambda: array("d"))
    # Rate mode (r<R>.json): Poisson arrivals at this many requests/s; None for a closed loop.
    request_rate: float | None = None
    arrival: str = "closed"
    repeat: int = 1  # which repeat of the level this file is
    repeats: int = 1  # how many the run asked for
    fill: dict = field(default_factory=dict)  # the level's `fill`, {} for older files
    workload: dict | None = None  # the synthetic workload's record, None for a prompt set
    # The mean context (prompt + half the output) a decode step read, over the requests that
    # succeeded with a prompt_tokens count (_context_mean), and how many were left out: the
    # speed model's context per request.
    context_tokens_mean: float | None = None
    context_skipped: int = 0
    # Through SGLang's router: the level file's `fleet` (what each replica served), else None.
    fleet: dict | None = None

    @property
    def closed_loop(self) -> bool:
        return self.request_rate is None

    @property
    def name(self) -> str:
        """The level as its file names it: c16, r2.5."""
        return f"c{self.concurrency}" if self.request_rate is None else f"r{self.request_rate:g}"


@dataclass
class Results:
    root: Path
    levels: list[Level]
    lossless: dict[str, dict]  # host -> the losslessness report
    status: dict[tuple[str, str], dict]  # (host, config) -> status.json
    run: dict  # run.json, when there is one
    # (host, config) -> api-check.json (the server stage's checks of the OpenAI API)
    api_checks: dict[tuple[str, str], dict] = field(default_factory=dict)
    files: int = 0
    bytes_read: int = 0
    run_dir: Path | None = None  # run.json's folder, relative to root

    @property
    def hosts(self) -> list[str]:
        return sorted({level.host for level in self.levels} | {h for h, _ in self.status})

    @property
    def records(self) -> int:
        return sum(level.records for level in self.levels)
