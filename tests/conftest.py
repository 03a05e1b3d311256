"""Test-session rules shared by every test directory.

- tests/guest runs only inside the QEMU RDMA guest (tests/guest/harness/run-guest-tests.sh);
  the host session leaves it out.
- Tests that need root, a bus or the guest fail loudly under CI=true when they cannot run:
  a skipped test is not a pass.
"""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("RDMA_VM_GUEST") == "1" else ["guest/*"]
