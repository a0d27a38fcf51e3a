"""Bounds the writer applies to what it records and the reader applies again to what it reads,
so that both call the same thing by the same name."""

from __future__ import annotations

# A GPU clock-event reason counts as throttling when it was active in at least this share of a
# level's busy samples (module_utils/benchmark/gpu_summary.py lists such reasons;
# analysis/telemetry.py warns about them).
THROTTLE_SHARE = 0.2
