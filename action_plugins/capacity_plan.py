# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""capacity_plan runs inside ansible-playbook's worker (action_plugins/kit_in_process.py): the plan
reads the model folder's configs on the controller and computes."""

from __future__ import annotations

from ansible.plugins.loader import action_loader

ActionModule = action_loader.get("kit_in_process", class_only=True)
