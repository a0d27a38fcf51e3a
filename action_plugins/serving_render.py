# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""serving_render runs inside ansible-playbook's worker (action_plugins/kit_in_process.py):
rendering launch commands reads nothing of the host, and the server stage renders at every
start."""

from __future__ import annotations

from ansible.plugins.loader import action_loader

ActionModule = action_loader.get("kit_in_process", class_only=True)
