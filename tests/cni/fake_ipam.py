"""A stand-in IPAM plugin, for what Debian's IPAM plugins cannot show: their failures on
demand, their stderr, and the verbs they were asked (GC and STATUS, which they lack).

Its `ipam` config: `log` (a file: one line "VERB CONTAINERID" per call), `fail` (a list of
"VERB" or "VERB CONTAINERID" to answer with error 11), `stderr` (a text to write there),
`routes` (ADD's, as given). ADD hands out 10.66.0.2/24. It imports nothing of the project:
FakeIpam runs it as a plugin executable."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> int:
    conf = json.load(sys.stdin)
    ipam = conf["ipam"]
    command = os.environ.get("CNI_COMMAND", "")
    call = f"{command} {os.environ.get('CNI_CONTAINERID', '')}".strip()
    with Path(ipam["log"]).open("a") as log:
        log.write(call + "\n")
    sys.stderr.write(ipam.get("stderr", ""))
    if command in ipam.get("fail", []) or call in ipam.get("fail", []):
        error = {"cniVersion": conf["cniVersion"], "code": 11, "msg": f"fake-ipam refused {call}"}
        json.dump(error, sys.stdout)
        return 1
    if command == "ADD":
        lease = {
            "cniVersion": conf["cniVersion"],
            "ips": [{"address": "10.66.0.2/24"}],
            "routes": ipam.get("routes", []),
        }
        json.dump(lease, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
