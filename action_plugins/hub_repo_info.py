# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""hub_repo_info runs inside ansible-playbook's worker (action_plugins/kit_in_process.py): it
always ran on the controller, which every run that asks the hub paid a Python start for."""

from __future__ import annotations

from ansible.plugins.loader import action_loader

ActionModule = action_loader.get("kit_in_process", class_only=True)
