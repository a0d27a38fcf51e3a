# Copyright: kimi-deploy-kit maintainers
# SPDX-License-Identifier: Apache-2.0
"""wheelhouse_pack runs inside ansible-playbook's worker (action_plugins/kit_in_process.py): the
archive is the controller's, packed once and then found in its cache."""

from __future__ import annotations

from ansible.plugins.loader import action_loader

ActionModule = action_loader.get("kit_in_process", class_only=True)
