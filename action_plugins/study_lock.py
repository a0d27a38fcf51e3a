# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""study_lock runs inside ansible-playbook's worker (action_plugins/kit_in_process.py): the study
lock is the controller's file, read and recorded at every run's start and end."""

from __future__ import annotations

from ansible.plugins.loader import action_loader

ActionModule = action_loader.get("kit_in_process", class_only=True)
