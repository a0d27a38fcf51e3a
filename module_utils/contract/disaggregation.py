"""A host's side of prefill-decode disaggregation, read from kimi_server_settings.disaggregation
(group_vars/all/serving.yml: its kimi_prefill_* or kimi_decode_* group): the serving render
turns it into SGLang's flags (module_utils/plan/serving.py), the fleet into the router's
(module_utils/router/fleet.py). Standard library only."""

from __future__ import annotations

MODES = ("prefill", "decode")


def side(settings) -> tuple[str, int | None]:
    """(mode, bootstrap port) of the settings' disaggregation: ("", None) for a host that serves
    whole requests, a decode server's port None. ValueError saying what is wrong."""
    settings = settings if isinstance(settings, dict) else {}
    mode = str(settings.get("mode") or "")
    if not mode:
        return "", None
    if mode not in MODES:
        raise ValueError(
            f"disaggregation mode {mode!r} is neither prefill nor decode (a host is in a "
            "kimi_prefill_* or a kimi_decode_* group, or in neither)"
        )
    if mode == "decode":
        return mode, None
    port = settings.get("bootstrap_port")
    if isinstance(port, bool) or not str(port).isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(
            f"bootstrap port {port!r} is not a port 1 to 65535 (kimi_disaggregation_bootstrap_port)"
        )
    return mode, int(port)
