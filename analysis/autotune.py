"""An autotune run's answer in the report: each host's tuned setting per band, with its goodput,
interval, runner-up and margin, read from results/<run>/<host>/autotune/search.json (autotune.yml,
docs/autotune.md) through the search's own answer (module_utils/autotune/search.py). The state is
outside input: read bounded; one that is not a search state is named, never guessed at."""

from __future__ import annotations

import os
from pathlib import Path

from ansible.module_utils.autotune import search
from ansible.module_utils.autotune.space import candidate_key
from ansible.module_utils.host.helpers import read_json_bounded

MAX_STATE_BYTES = 32 << 20
COLUMNS = (
    "host",
    "band",
    "tuned_setting",
    "goodput_requests_per_s",
    "goodput_ci95_low",
    "goodput_ci95_high",
    "rung",
    "runner_up",
    "runner_up_goodput_requests_per_s",
    "margin_share",
    "within_interval",
    "trials",
    "failed_trials",
    "stop",
    "trial_minutes",
    "overhead_minutes",
)


def _state(path: Path) -> tuple[dict | None, str | None]:
    try:
        state = read_json_bounded(str(path), MAX_STATE_BYTES)
    except ValueError as exc:
        return None, str(exc)
    if not isinstance(state, dict) or state.get("version") != search.STATE_VERSION:
        return None, f"{path} is not a search state of this kit"
    return state, None


def rows(results_dir: Path, hosts: list[str]) -> tuple[list[dict], list[str]]:
    """(one row per host and band, problems): the search's pick per band."""
    found, problems = [], []
    for host in hosts:
        path = Path(results_dir) / host / "autotune" / "search.json"
        if not os.path.lexists(path):
            continue
        state, problem = _state(path)
        if state is None:
            problems.append(problem)
            continue
        try:
            answer = search.answer(state)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            problems.append(f"{path} cannot be read as a search ({type(exc).__name__})")
            continue
        for band, result in answer["bands"].items():
            best, runner, margin = result["best"], result["runner_up"], result["margin"] or {}
            found.append(
                {
                    "host": host,
                    "band": int(band),
                    "tuned_setting": candidate_key(best["knobs"]) if best else None,
                    "goodput_requests_per_s": best["goodput"] if best else None,
                    "goodput_ci95_low": best["low"] if best else None,
                    "goodput_ci95_high": best["high"] if best else None,
                    "rung": best["rung"] if best else None,
                    "runner_up": candidate_key(runner["knobs"]) if runner else None,
                    "runner_up_goodput_requests_per_s": runner["goodput"] if runner else None,
                    "margin_share": margin.get("share"),
                    "within_interval": margin.get("within_interval"),
                    "trials": answer["trials"],
                    "failed_trials": answer["failed"],
                    "stop": answer["stop"],
                    "trial_minutes": round(answer["trial_seconds"] / 60, 2),
                    "overhead_minutes": round(answer["overhead_seconds"] / 60, 2),
                }
            )
    return found, problems


def stated(tuned: list[dict]) -> list[str]:
    """The recommendation of an autotune run, one line per host: its tuned setting per band."""
    by_host: dict[str, list[str]] = {}
    for row in tuned:
        setting = row["tuned_setting"] or "nothing measured"
        goodput = row["goodput_requests_per_s"]
        figure = f" ({goodput:.3g} requests/s under the SLO)" if goodput is not None else ""
        by_host.setdefault(row["host"], []).append(f"c{row['band']}: {setting}{figure}")
    return [
        f"Tuned setting on {host} (autotune.yml, written to host_vars/{host}/autotune.yml): "
        + "; ".join(parts)
        for host, parts in by_host.items()
    ]
