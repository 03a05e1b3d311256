"""A claim's RDMA limit: its device's line in its cgroup's rdma.max (the rdma controller of
cgroup v2), written as a step of the claim once it is placed and put back to `max` when it
ends. The cgroup is checked before the claim touches anything; a claim that names one
without a limit only reads its usage.

Only the claim's own device's line is written: other devices' lines in the same cgroup,
and other cgroups, are never touched. The rdma controller a limit enabled in the ancestors'
cgroup.subtree_control stays enabled (other cgroups may count on it by then).
"""

from __future__ import annotations

from rdmad.core.backend import CgroupBackend
from rdmad.core.steps import step
from rdmad.model import Claim, ClaimOptions, RdmaUsage


class Limits:
    def __init__(self, cgroups: CgroupBackend) -> None:
        self._cgroups = cgroups

    def check(self, opts: ClaimOptions) -> str:
        """The cgroup `opts` names, relative to the cgroup2 mount ("" for none); a named
        error (InvalidArgs, NoSuchCgroup, NotSupported) for one a limit cannot go in."""
        return self._cgroups.resolve(opts.cgroup) if opts.cgroup else ""

    def apply(self, claim: Claim) -> None:
        """Write the claim's limit (a kernel step of the claim, after its PENDING save)."""
        if claim.limit is None:
            return
        self._cgroups.set_limit(claim.cgroup, claim.device, claim.limit)
        step("limit-written", f"claim {claim.id}")

    def lift(self, claim: Claim) -> None:
        """Put the claim's device's line back to `max` (idempotent; a cgroup that is gone
        leaves nothing to do)."""
        if claim.limit is None:
            return
        self._cgroups.lift(claim.cgroup, claim.device)
        step("limit-lifted", f"claim {claim.id}")

    def usage(self, claim: Claim) -> RdmaUsage | None:
        """The claim's device in its cgroup now, None without a cgroup or once it is gone."""
        if not claim.cgroup:
            return None
        return self._cgroups.usage(claim.cgroup, claim.device)
