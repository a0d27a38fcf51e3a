#!/usr/bin/env python3
# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
# Managed by the Kimi deploy kit (roles/router): local changes are overwritten.
"""Starts SGLang's router (sglang-router) with its API key read from a root-only file.

sglang-router takes its key only as --api-key, which every local user would read in the
process list; this adds it to the router's arguments inside the process instead:

    kimi-router-launch SECRETS_FILE [sglang_router.launch_router arguments...]

SECRETS_FILE is JSON ({"api_key": "..."}); "-" means no key.
"""

import json
import sys

MAX_SECRETS_BYTES = 65536


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: kimi-router-launch SECRETS_FILE [router arguments]")
    secrets_file, arguments = sys.argv[1], sys.argv[2:]
    if "--api-key" in arguments:
        sys.exit("kimi-router-launch: the API key comes from SECRETS_FILE, not the arguments")
    key = ""
    if secrets_file != "-":
        with open(secrets_file, encoding="utf-8") as handle:
            secrets = json.loads(handle.read(MAX_SECRETS_BYTES))
        key = secrets.get("api_key", "") if isinstance(secrets, dict) else ""
        if not isinstance(key, str):
            sys.exit(f"kimi-router-launch: api_key in {secrets_file} is not text")
    from sglang_router.launch_router import main as launch

    sys.argv = ["sglang_router.launch_router", *arguments, *(["--api-key", key] if key else [])]
    launch()


if __name__ == "__main__":
    main()
