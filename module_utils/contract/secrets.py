"""How the kit names and masks secrets, wherever it records or shows something: plans, level
files, logs, support bundles and the analysis' comparisons."""

from __future__ import annotations

# What Ansible itself shows for a no_log value: one mask string for everything the kit hides.
MASK = "********"
# The launch environment's secrets (the server's own): masked in every rendered config.
LAUNCH_SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "SGLANG_API_KEY")
# The controller environment's secrets: their values are scrubbed out of a support bundle
# (python -m analysis bundle).
CONTROLLER_SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "KIMI_SERVER_API_KEY")
# An environment variable whose name holds one of these is taken for a secret.
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PROXY")
# Launch flags whose value is a secret: --config is the kit's root-only file with the key.
SECRET_FLAGS = frozenset({"--api-key", "--config"})


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return upper in LAUNCH_SECRET_ENV or any(word in upper for word in SECRET_WORDS)
