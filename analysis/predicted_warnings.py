"""The warnings of measured against predicted (analysis.predicted): slower_than_predicted,
one per level whose step ran more than SLOW above the speed model, naming the part the run's
records point at, and acceptance_below_published, one per host, config and prompt set.

A level is slow when its step time is more than SLOW above the smaller of the prediction with
the host's records and the one with the profile's figures alone: a host whose own all-reduce
record is slow is slower than its hardware should be, and the record is what names the part.
The parts named, strongest evidence first: the all-reduce (the host's record against the
profile's figure, where it accounts for at least half the gap), the GPUs' clocks (the level's
telemetry: a throttle reason in 20% or more of busy samples, or busy GPUs under 80% of their
maximum SM clock), a saturated client (its events are read late, so its decode time holds
its own delay). Acceptance below the published figure (more than 20% fewer tokens a step) is
its own warning: it costs tokens/s whatever the step time.
"""

from __future__ import annotations

from dataclasses import dataclass

from analysis import telemetry

SLOW = 0.25  # a step more than this above the prediction warns
ACCEPT_LOW = 0.8  # accepted tokens per step below this share of the prediction warns
# The all-reduce is named when the host's record adds at least this share of the gap between
# the measured step and the profile's prediction.
ALLREDUCE_SHARE = 0.5
# ... and makes the all-reduce part at least this much dearer than the profile's figure.
ALLREDUCE_SLOWER = 1.25
# The part a slow step's warning names (warnings[].likely).
PARTS = ("allreduce", "power_cap", "thermal", "hw_slowdown", "clocks", "client_saturated")
CLOCK_CHECK = {
    "power_cap": "the power limit (nvidia-smi -q -d POWER: the enforced limit against the "
    "default), cooling and other work on these GPUs",
    "thermal": "cooling: airflow, inlet temperature, fans (nvidia-smi -q -d TEMPERATURE)",
    "hw_slowdown": "the power supply and the hardware brake signal (nvidia-smi -q -d "
    "PERFORMANCE), and the GPUs' health (dmesg.txt in debug/ for Xid lines)",
    "clocks": "application clocks and locked clocks (nvidia-smi -q -d CLOCK), the power limit "
    "and cooling",
}


@dataclass(frozen=True)
class Cause:
    """One part's verdict on a slow step. part: what warnings[].likely names, None when the
    part is not the cause; text: the line for the message's Likely list (with a part), its
    Checked list (recorded, no part) or its Not recorded list (not recorded)."""

    part: str | None
    text: str
    recorded: bool = True


# -- slower_than_predicted -------------------------------------------------------------------


def _describe_level(row: dict) -> str:
    verify, batch = row["verify_tokens_per_request"], row["batch"]
    return (
        f"{row['profile']}, TP {row['tp_size']}, {batch} request{'s' if batch != 1 else ''} a "
        f"step verifying {verify} token{'s' if verify != 1 else ''} each, context "
        f"{row['context_tokens']} tokens"
    )


def _one_allreduce_us(part: dict) -> float | None:
    count = part.get("count") or 0
    return part["ms"] * 1000.0 / count if count else None


def _allreduce_cause(parts, nominal_parts, figures, nominal, measured, profile_step) -> Cause:
    """The all-reduce is the cause when the host's record accounts for the gap."""
    if "allreduce_table" not in figures:
        return Cause(
            None,
            "the all-reduce (no all-reduce record in the run: the tuning stage's check writes "
            "it, the benchmark copies it into each level's provenance)",
            recorded=False,
        )
    host_part, profile_part = parts.get("allreduce"), nominal_parts.get("allreduce")
    if not host_part or not profile_part or not host_part.get("count"):
        return Cause(None, "the all-reduce (none at TP 1)")
    host_us, profile_us = _one_allreduce_us(host_part), _one_allreduce_us(profile_part)
    added = host_part["ms"] - profile_part["ms"]
    gap = measured - profile_step
    if not (
        gap > 0
        and added >= ALLREDUCE_SHARE * gap
        and host_part["ms"] >= ALLREDUCE_SLOWER * profile_part["ms"]
    ):
        return Cause(
            None,
            f"the all-reduce (this host's record: {host_us:.0f} us an all-reduce against the "
            f"profile's {profile_us:.0f} us)",
        )
    message = host_part.get("message_bytes") or 0
    return Cause(
        "allreduce",
        f"the all-reduce: this host's all-reduce check (the tuning stage's record) takes "
        f"{host_us:.0f} us for this step's {message / 1024:.0f} KiB message where the "
        f"profile's figures give {profile_us:.0f} us ({nominal['allreduce_busbw_gbs']:g} "
        f"GB/s bus bandwidth, {nominal['allreduce_latency_us']:g} us latency): "
        f"{host_part['ms']:.1f} ms of all-reduce a step ({host_part['count']} of them) "
        f"instead of {profile_part['ms']:.1f}. Check: NCCL's transport and settings "
        "(nccl.txt in debug/, NCCL_P2P_DISABLE, NCCL_P2P_LEVEL and NCCL_NVLS_ENABLE in the "
        "launch environment), the fabric manager and NVLink state on NVSwitch hosts "
        "(nvidia-smi topo -m, nvidia-smi -q fabric state), the PCIe ACS report on PCIe "
        "hosts, then run the tuning stage's check again (--tags tuning)",
    )


def _held_down_most(levels: list) -> tuple[dict | None, bool]:
    """(the level telemetry's strongest throttle finding or None, whether any level had
    telemetry)."""
    strongest = None
    seen = False
    for level in levels:
        held = telemetry.held_down(level.summary, telemetry.server_gpu_indexes(level.provenance))
        if held is None:
            continue
        seen = True
        if held["reason"] and (
            strongest is None or (held["share"] or 0) > (strongest["share"] or 0)
        ):
            strongest = held
    return strongest, seen


def _clock_cause(levels: list) -> Cause:
    """The GPUs' clocks are the cause when the telemetry saw them held down."""
    strongest, seen = _held_down_most(levels)
    if strongest is None:
        if seen:
            return Cause(
                None, "the GPUs' clocks (telemetry: no throttle reason, clocks near their maximum)"
            )
        return Cause(
            None,
            "the GPUs' clocks (no GPU telemetry at this level: benchmark_telemetry)",
            recorded=False,
        )
    reason = strongest["reason"]
    clocks = ""
    if strongest["sm_clock_mhz_mean"] is not None:
        clocks = f" (SM clock {strongest['sm_clock_mhz_mean']:.0f}"
        peak = strongest["sm_clock_max_mhz"]
        clocks += f" of {peak:.0f} MHz)" if peak is not None else " MHz)"
    gpus = telemetry.gpu_list(strongest["gpus"])
    if reason == "clocks":
        what = (
            f"the GPUs' clocks: {gpus} ran busy below {telemetry.LOW_CLOCK_SHARE:.0%} of their "
            f"maximum SM clock{clocks} with no throttle reason recorded"
        )
    else:
        their = "its" if len(strongest["gpus"]) == 1 else "their"
        what = (
            f"the {telemetry.REASON_WORDS[reason]}: {gpus} held {their} clocks down for the "
            f"{telemetry.REASON_WORDS[reason]} in {strongest['share']:.0%} of busy samples"
            f"{clocks}"
        )
    return Cause(
        reason,
        f"{what}, where the model's figures are those of GPUs at full clocks. Check: "
        f"{CLOCK_CHECK[reason]}",
    )


def _client_cause(levels: list) -> Cause:
    """The client is the cause when it was saturated: it read each event late."""
    saturated = [lv for lv in levels if lv.client.get("saturated")]
    if not saturated:
        return Cause(None, "the client (not saturated)")
    reasons = saturated[0].client.get("saturated_reasons") or []
    shown = "; ".join(str(r)[:120] for r in reasons[:3] if isinstance(r, str))
    return Cause(
        "client_saturated",
        "the client: the benchmark client was saturated"
        + (f" ({shown})" if shown else "")
        + ", so it read each event late and its decode time holds its own delay. Check: "
        "the client's CPU (client.cpu_fraction), fewer requests in flight per client "
        "process, nothing else on the controller's cores",
    )


def _slow_message(compared: dict, expected: float, profile_step: float, causes) -> str:
    measured = compared["step_ms"]
    basis = (
        "the profile's figures"
        if expected == profile_step and compared["figures"] != "the profile's figures"
        else compared["figures"]
    )
    message = (
        f"step time {measured:.1f} ms is {measured / expected - 1:.0%} above the speed model's "
        f"{expected:.1f} ms ({_describe_level(compared)}; {basis}). "
    )
    findings = [c.text for c in causes if c.part]
    clean = [c.text for c in causes if not c.part and c.recorded]
    unknown = [c.text for c in causes if not c.recorded]
    if findings:
        message += "Likely: " + "; ".join(findings) + ". "
    else:
        message += (
            "Nothing the run recorded explains it. Check: the server's log for the step time "
            "SGLang reports (debug/server.log.gz), the launch against the plan's (Provenance), "
            "CUDA graphs for this batch size, other work on the host. "
        )
    if clean:
        message += "Checked and not the cause: " + "; ".join(clean) + ". "
    if unknown:
        message += "Not recorded: " + "; ".join(unknown) + ". "
    accepted = compared["accepted_tokens_per_step_ratio"]
    if accepted is not None and accepted < ACCEPT_LOW:
        message += (
            "Acceptance is below the published figure too "
            f"({compared['accepted_tokens_per_step']:.2f} against "
            f"{compared['accepted_tokens_per_step_predicted']:.2f} tokens a step): "
            "see acceptance_below_published. "
        )
    return message.strip()


def slow_warning(compared, levels, prediction, profile_only, figures, nominal) -> dict | None:
    """The slower_than_predicted warning of one compared row (analysis.predicted), or None
    when its step is within SLOW of the speed model."""
    measured = compared["step_ms"]
    expected = min(prediction["step_ms"], profile_only["step_ms"])
    if measured is None or not expected or measured <= (1 + SLOW) * expected:
        return None
    parts, nominal_parts = compared["_parts"]
    causes = (
        _allreduce_cause(parts, nominal_parts, figures, nominal, measured, profile_only["step_ms"]),
        _clock_cause(levels),
        _client_cause(levels),
    )
    return {
        "kind": "slower_than_predicted",
        "severity": "warning",
        "where": compared["_where"],
        "message": _slow_message(compared, expected, profile_only["step_ms"], causes),
        "host": compared["host"],
        "config": compared["config"],
        "prompt_set": compared["prompt_set"],
        "concurrency": compared["concurrency"],
        "likely": [c.part for c in causes if c.part],
        "step_ms": measured,
        "step_ms_predicted": prediction["step_ms"],
        "step_ms_predicted_profile": profile_only["step_ms"],
    }


# -- acceptance_below_published --------------------------------------------------------------


def acceptance_warnings(rows: list[dict]) -> list[dict]:
    """One acceptance_below_published warning per host, config and prompt set whose levels
    accept more than 1 - ACCEPT_LOW fewer tokens a step than the published figure gives."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        ratio = row["accepted_tokens_per_step_ratio"]
        if row["verify_tokens_per_request"] == 1 or ratio is None or ratio >= ACCEPT_LOW:
            continue
        groups.setdefault((row["host"], row["config"], row["prompt_set"]), []).append(row)
    found = []
    for (host, config, prompt_set), group in groups.items():
        levels = ", ".join(
            f"c{r['concurrency']} {r['accepted_tokens_per_step']:.2f} against "
            f"{r['accepted_tokens_per_step_predicted']:.2f}"
            for r in sorted(group, key=lambda r: r["concurrency"])
        )
        found.append(
            {
                "kind": "acceptance_below_published",
                "severity": "warning",
                "where": f"{host} / {config} / {prompt_set}",
                "message": (
                    f"accepted tokens per step below what the published acceptance gives "
                    f"({group[0]['acceptance_source']}; for DDTree the tree its budget buys from "
                    f"that chain): {levels}. Each request's tokens/s falls by as much whatever "
                    "the step time. Check: the drafter's revision against the target's "
                    "(Provenance; published figures of another model or prompt set differ), "
                    "the temperature (the published figures are greedy), the chat template "
                    "the prompts were rendered with, and the losslessness check"
                ),
                "host": host,
                "config": config,
                "prompt_set": prompt_set,
                "concurrencies": [r["concurrency"] for r in group],
            }
        )
    return found
