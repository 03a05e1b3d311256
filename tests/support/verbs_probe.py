"""How many user contexts and protection domains a process gets on an RDMA device, through
libibverbs itself (ctypes): what the rdma cgroup's hca_handle and hca_object limits cap.

  python -m tests.support.verbs_probe DEVICE CONTEXTS PDS

opens up to CONTEXTS contexts, allocates up to PDS PDs on the first, prints
`contexts=N pds=M`, then holds them until stdin closes (so a test can read rdma.current
while they are held), and exits 0."""

from __future__ import annotations

import ctypes
import sys


def _verbs() -> ctypes.CDLL:
    lib = ctypes.CDLL("libibverbs.so.1")
    lib.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
    lib.ibv_get_device_list.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.ibv_get_device_name.restype = ctypes.c_char_p
    lib.ibv_get_device_name.argtypes = [ctypes.c_void_p]
    lib.ibv_open_device.restype = ctypes.c_void_p
    lib.ibv_open_device.argtypes = [ctypes.c_void_p]
    lib.ibv_alloc_pd.restype = ctypes.c_void_p
    lib.ibv_alloc_pd.argtypes = [ctypes.c_void_p]
    return lib


def probe(name: str, contexts: int, pds: int) -> tuple[int, int]:
    lib = _verbs()
    count = ctypes.c_int()
    devices = lib.ibv_get_device_list(ctypes.byref(count))
    found = [
        devices[i]
        for i in range(count.value)
        if lib.ibv_get_device_name(devices[i]) == name.encode()
    ]
    if not found:
        raise SystemExit(f"verbs_probe: no RDMA device {name!r}")
    opened = [c for c in (lib.ibv_open_device(found[0]) for _ in range(contexts)) if c]
    allocated = (
        [p for p in (lib.ibv_alloc_pd(opened[0]) for _ in range(pds)) if p] if opened else []
    )
    return len(opened), len(allocated)


def main() -> None:
    name, contexts, pds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    got_contexts, got_pds = probe(name, contexts, pds)
    print(f"contexts={got_contexts} pds={got_pds}", flush=True)
    sys.stdin.read()  # hold them until the test closes our stdin


if __name__ == "__main__":
    main()
