"""The owner label rdmad-dra gives each hold in rdmad: dra/<ResourceClaim UID>/<device>,
the device by its name in the node's ResourceSlice. The claim's UID makes prepare and
unprepare idempotent with no state of the plugin's own (rdmad lists and persists the
label); the device's name tells the offer which share slots Kubernetes holds, so that they
stay published under their names while the scheduler counts them as allocated.

rdmad-cni's pod mode matches the prefix dra/ alone. A label without the device part
(dra/<claim UID>, as the plugin wrote before shared mode) is still read as that claim's.
"""

from __future__ import annotations

OWNER_PREFIX = "dra/"


def owner_label(claim_uid: str, device: str) -> str:
    return f"{OWNER_PREFIX}{claim_uid}/{device}"


def parse_owner(owner: str) -> tuple[str, str] | None:
    """(claim UID, device; "" if not named) of a label rdmad-dra wrote; None for any other."""
    if not owner.startswith(OWNER_PREFIX):
        return None
    uid, _, device = owner[len(OWNER_PREFIX) :].partition("/")
    return (uid, device) if uid else None
