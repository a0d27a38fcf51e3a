"""Test support. Importing it makes the kit's stages importable as ansible.module_utils.<stage>
(module_utils/__init__.py), so a helper run on its own (`python -m tests.support.<x>`) imports
the kit's code under the names pytest and Ansible give it."""

import module_utils  # noqa: F401
