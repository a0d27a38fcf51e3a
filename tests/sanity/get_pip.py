"""Stands in for the get-pip.py that ansible-test downloads to put pip into its sanity venvs.

ansible-test fetches get-pip-<version>.py from its own CI file server, which is outside the
package registries this kit may use; it first looks in ~/.ansible/test/cache/get_pip_<v>.py,
so tests/integration/test_sanity.py puts this file there. ansible-test runs it with the venv's
Python and pip's own arguments, as it would the real one:

    python get_pip_24_2.py --disable-pip-version-check pip==24.2 --no-setuptools --no-wheel

Pip comes from the Python's own ensurepip (no download); the requested versions are then
installed with it from the configured index, the one every other requirement comes from.
"""

from __future__ import annotations

import ensurepip
import os
import subprocess
import sys

# get-pip.py's own switches, which `pip install` does not know.
GET_PIP_ONLY = {"--no-setuptools", "--no-wheel"}
# A pip install of one or two wheels; far beyond it, the index is not answering.
INSTALL_DEADLINE_S = 300


def main(argv: list[str]) -> int:
    if sys.prefix == sys.base_prefix:
        sys.exit("get_pip.py installs pip only into a virtual environment")
    # ensurepip drops the PIP_* variables and sets PIP_CONFIG_FILE=/dev/null in this process's
    # environment; the install below must see the machine's pip configuration (index, CA).
    environment = dict(os.environ)
    ensurepip.bootstrap(upgrade=True)
    pip_args = [arg for arg in argv if arg not in GET_PIP_ONLY]
    if not any(not arg.startswith("-") for arg in pip_args):
        return 0
    command = [sys.executable, "-m", "pip", "install", *pip_args]
    return subprocess.run(
        command, check=False, timeout=INSTALL_DEADLINE_S, env=environment
    ).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
