"""The kubelet's calls to rdmad-dra (testbed/dra/kubelet.py), made for the soak in a process
of their own: gRPC's fork handlers, in a process that forks and execs all the time as the
soak's does (rdmad-cni, ip, rdmad), can crash or hang a child forked while a call is in
flight (grpc/grpc#13998, #22624). With the calls in the soak's process, an rdmad-dra it
started died of SIGSEGV before its first line, and a 60 s run hung (not diagnosed further),
both after gRPC logged "Other threads are currently calling into gRPC, skipping fork()
handlers". So the soak's process never loads gRPC.

`python -m tests.soak.kubelet_calls`: one JSON request a line on stdin, {"op": "prepare"
or "unprepare", "endpoint": the plugin's DRA socket, "claim": [namespace, uid, name]}; one
JSON answer a line on stdout: {"error": the claim's error, "" for none}, or {"failed":
why the call got no answer}.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import grpc

from testbed.dra import kubelet
from tests.dra.contract import SERVICE


async def answer(request: dict[str, Any]) -> dict[str, str]:
    ref = kubelet.Claim(*request["claim"])
    try:
        if request["op"] == "prepare":
            prepared = await kubelet.prepare_devices(request["endpoint"], SERVICE, [ref])
            return {"error": prepared[ref.uid].error}
        unprepared = await kubelet.unprepare(request["endpoint"], SERVICE, [ref])
        return {"error": unprepared[ref.uid]}
    except grpc.aio.AioRpcError as exc:
        return {"failed": f"{exc.code()}: {exc.details()}"}


async def main() -> None:
    while line := await asyncio.to_thread(sys.stdin.readline):
        print(json.dumps(await answer(json.loads(line))), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
