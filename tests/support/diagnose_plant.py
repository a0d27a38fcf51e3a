"""What the support bundle's tests plant on a host and look for in its archive: every form of
a secret a careless writer could leave (secret_scan's derived forms, as text), and the members
that carry each source the bundle reads, which must come out scrubbed, never dropped."""

from __future__ import annotations

from tests.support.secret_scan import derived_forms


def forms(secret: str) -> list[str]:
    """The secret, its unkeyed digests and its base64 forms, as text to plant."""
    return [value.decode() for value in derived_forms(secret).values()]


def planted(secrets, line: str = "seen {} here") -> str:
    """Every form of every secret, each on a line of its own."""
    return "".join(line.format(form) + "\n" for secret in secrets for form in forms(secret))


# Members of a host's archive whose source the tests plant secrets in: each must be there,
# with the secrets masked (the disk usage member names its folder, so the tests add it).
SCRUBBED_SOURCES = (
    "records/launch.json",
    "records/api-check.json",
    "records/runtime.json",
    "records/versions.json",
    "results/canary.json",
    "results/preflight.json",
    "tuning/tuning-state.json",
    "tuning/acs-report.json",
    "nccl/nccl.conf",
    "server/sglang.log",
    "server/sglang-secrets.yaml",
    "server/kimi-sglang.env",
    "canary/logs/dflash.log",
    "runtime/release/pip-freeze.txt",
    "runtime/release/check-env.txt",
    "kernel/dmesg-nvrm-xid.txt",
)
# A canary log named after the API key: its name masked, then made safe.
SECRET_NAMED_LOG = "canary/logs/________.log"
