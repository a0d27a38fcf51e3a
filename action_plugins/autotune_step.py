# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""autotune_step runs inside ansible-playbook's worker (action_plugins/kit_in_process.py): the
search's state and the trials' level files are the controller's."""

from __future__ import annotations

from ansible.plugins.loader import action_loader

ActionModule = action_loader.get("kit_in_process", class_only=True)
