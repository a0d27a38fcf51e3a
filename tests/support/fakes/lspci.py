#!/usr/bin/python3
"""A stand-in for `lspci -vvv -s BDF` that prints a PCI bridge with its ACS control flags.

The flags come from /etc/fake-lspci/acsctl.json on the test host (bridge BDF to the ACSCtl
flags, e.g. "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-");
FAKE_LSPCI_ACSCTL moves it. A bridge not listed has no ACS capability. The layout of the output
is lspci's own.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ACSCTL_FILE = Path(os.environ.get("FAKE_LSPCI_ACSCTL", "/etc/fake-lspci/acsctl.json"))
ACSCAP = "SrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans+"


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "-vvv" or argv[1] != "-s":
        sys.stderr.write("fake lspci: only `lspci -vvv -s BDF` is answered\n")
        return 2
    bdf = argv[2]
    flags = json.loads(ACSCTL_FILE.read_text()) if ACSCTL_FILE.is_file() else {}
    lines = [
        f"{bdf} PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0) "
        "(prog-if 00 [Normal decode])",
        "\tControl: I/O+ Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR+",
    ]
    if bdf in flags:
        lines += [
            "\tCapabilities: [1d0 v1] Access Control Services",
            f"\t\tACSCap:\t{ACSCAP}",
            f"\t\tACSCtl:\t{flags[bdf]}",
        ]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
