"""The wheelhouse_pack task: its arguments and what it does with them, shared by the module
(library/wheelhouse_pack.py) and its action plugin, which runs it inside ansible-playbook's
worker (module_utils/host/in_process.py): the archive is the controller's, packed (or found in
its cache) by every runtime and weights run."""

from __future__ import annotations

from ansible.module_utils.host import wheelhouse
from ansible.module_utils.host.in_process import TaskError

SPEC = {
    "src": {"type": "path", "required": True},
    "cache_dir": {"type": "path", "required": True},
}


def act(p: dict, _check_mode: bool) -> dict:
    """The module's result for checked params p; the cache is the controller's own, so nothing
    on a host changed (and check mode still packs: the copy compares with the archive)."""
    try:
        result = wheelhouse.pack(p["src"], p["cache_dir"])
    except (wheelhouse.WheelhouseError, OSError) as error:
        raise TaskError(f"Packing the wheelhouse: {error}.") from None
    return {"changed": False, **result}
