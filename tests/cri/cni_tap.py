"""A chained CNI plugin that records each call containerd makes to its network and changes
nothing: a JSON line per call (command, container id, CNI_ARGS) appended to the config's
`log`; ADD passes prevResult on as its result. Run by the `cni-tap` wrapper that
CniTap writes (tests/cri/conftest.py)."""

import json
import os
import sys

VERSIONS = ["0.3.0", "0.3.1", "0.4.0", "1.0.0"]


def main() -> None:
    conf = json.load(sys.stdin)
    command = os.environ.get("CNI_COMMAND", "")
    if command == "VERSION":
        print(json.dumps({"cniVersion": conf["cniVersion"], "supportedVersions": VERSIONS}))
        return
    call = {
        "command": command,
        "container": os.environ.get("CNI_CONTAINERID", ""),
        "args": os.environ.get("CNI_ARGS", ""),
    }
    with open(conf["log"], "a") as log:
        log.write(json.dumps(call) + "\n")
    if command == "ADD":
        print(json.dumps(conf["prevResult"]))


if __name__ == "__main__":
    main()
