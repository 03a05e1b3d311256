"""What one journal event carries: a MESSAGE_ID naming its kind and whichever of the
RDMAD_DEVICE, RDMAD_NETNS, RDMAD_CLAIM, RDMAD_REASON and RDMAD_ERROR fields apply, so
that e.g.

    journalctl -u rdmad MESSAGE_ID=<MESSAGE_CLAIMED> RDMAD_DEVICE=mlx5_0

lists one device's claims. Write events with `log_event()` (`log_claim_event()` for one
claim's). Plain logging, no systemd: the core logs its own events here, and rdmad.daemon.journal
decides where records go.
"""

from __future__ import annotations

import logging
from typing import Final

from rdmad.model import Claim

# Fixed per event kind (generated once with uuid4, never change them: users filter on them).
MESSAGE_CLAIMED: Final = "ff8eafd40d364c19a34673bc3b1e4b38"
MESSAGE_RELEASED: Final = "0935d984661549fbb4dcd1e850708258"
MESSAGE_DEVICE_ADDED: Final = "57347e5e9bd8441c83563bae742a33e5"
MESSAGE_DEVICE_REMOVED: Final = "60d64da90e534b0dba978ee2ee41e449"
MESSAGE_NETNS_GONE: Final = "4d03436005404628b3aa6b57411c3ef6"  # a claim released: netns died
# a claim released: its device was removed (MESSAGE_DEVICE_REMOVED is the device's own event)
MESSAGE_RELEASED_DEVICE_REMOVED: Final = "62173fe5971f4a0a94114efd6a5daec7"
MESSAGE_MODE_CHANGED: Final = "9f92938cd6c84151aa659318143eb1ad"
MESSAGE_RECONCILED: Final = "af5005ea085c4c00a3e94c9655ed0957"
MESSAGE_GIDS_CHANGED: Final = "4120b9189eb549368916a48434483c5f"
MESSAGE_RESYNC: Final = "55820fbd8b124c448138f9eaf3ea0606"
# a claim refused or failed (and rolled back); RDMAD_ERROR: the error's D-Bus name
MESSAGE_CLAIM_FAILED: Final = "56c8106540d048d7ad35af2ff6d5b9ce"
# a claim or release a crash interrupted, finished at start
MESSAGE_INTERRUPTED: Final = "48dd9d4e6aaf4b678d13cb280cfc1872"
# what a claim took is not back in init_net as it was (yet): an operator may have to step in
MESSAGE_NOT_RETURNED: Final = "84fed45eb174426fa1eb8cdd58df960d"
MESSAGE_GIDS_UNREADABLE: Final = "ee57270e940c4ce2998c131d4fcc3b83"  # the claim works without
# a claim's netdev's MAC and addresses could not be read: the claim works without
MESSAGE_NETDEV_UNREADABLE: Final = "b87c6ba974574f1f8a4d996280bfebde"
# a netns death reported by an nsid that a live claim's netns has since been given: ignored
MESSAGE_NSID_REUSED: Final = "6a1e682f2c624b41a6ca2c92b1255c4d"
# a job the daemon ran in the background failed (a bug, or a kernel answer it did not
# expect); RDMAD_* name the claim or device it was about, if any
MESSAGE_JOB_FAILED: Final = "a07cb651ec544098b67a0071cea51a7a"
MESSAGE_START: Final = "437dce355abf4ffebd66e09ca16f3080"
MESSAGE_STOP: Final = "09a98dc9b33d4b1092e6415b2d426007"

# record attribute == journal field name; the stderr format shows them as the short key
EVENT_FIELDS: Final = {
    "RDMAD_DEVICE": "device",
    "RDMAD_NETNS": "netns",
    "RDMAD_CLAIM": "claim",
    "RDMAD_REASON": "reason",
    "RDMAD_ERROR": "error",
    "RDMAD_STEP": "step",  # rdmad.core.steps: how far a claim or release got
}


def log_claim_event(
    logger: logging.Logger,
    message_id: str,
    claim: Claim,
    msg: str,
    *,
    reason: str | None = None,
    error: str | None = None,
    level: int = logging.INFO,
) -> None:
    """log_event about one claim: its device, netns and id are the fields."""
    fields = _fields(message_id, claim.device, claim.netns, claim.id, reason, error)
    # stacklevel: CODE_FILE/CODE_LINE name the caller, not this helper.
    logger.log(level, "%s", msg, extra=fields, stacklevel=2)


def log_event(
    logger: logging.Logger,
    message_id: str,
    msg: str,
    *,
    device: str | None = None,
    netns: str | None = None,
    claim: str | None = None,
    reason: str | None = None,
    error: str | None = None,
    level: int = logging.INFO,
    exc_info: BaseException | None = None,
) -> None:
    """Log one event with its MESSAGE_ID and whichever of the RDMAD_* fields apply (and the
    traceback of `exc_info`, for a failure that may be a bug)."""
    fields = _fields(message_id, device, netns, claim, reason, error)
    # "%s" + arg: a '%' inside msg (a netns path, a name) must not be %-formatted.
    logger.log(level, "%s", msg, extra=fields, stacklevel=2, exc_info=exc_info)


def _fields(message_id: str, *values: str | None) -> dict[str, str]:
    """The record's journal fields: the MESSAGE_ID, and each RDMAD_* one that has a value
    (`values` in the order device, netns, claim, reason, error)."""
    extra = {"MESSAGE_ID": message_id}
    names = ("RDMAD_DEVICE", "RDMAD_NETNS", "RDMAD_CLAIM", "RDMAD_REASON", "RDMAD_ERROR")
    extra.update(
        (key, str(value)) for key, value in zip(names, values, strict=True) if value is not None
    )
    return extra
