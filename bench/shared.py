"""6. Shared claims (a macvlan of the device's netdev, made in the netns under its name and
MTU, with an address, up; released by deleting it), settled, taking turns with the same
requests by raw pyroute2 (bench.claim.Raw). 6b: the same share claimed by a user polkit
allows (nobody, into a netns it owns) beside root's, on one daemon with polkitd on its bus,
and polkit's CheckAuthorization alone, the round trip a user's claim adds.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.claim import NS_ADDR, NS_IFNAME, NS_MTU, Raw, check_claimed
from bench.columns import Ways, side_by_side
from bench.common import (
    Params,
    Results,
    Row,
    Settler,
    claim_cycle,
    claim_options,
    client,
    many_veths,
    ms_since,
    rdmad,
)
from bench.stats import RatioCheck, spread
from rdmad.bus.polkit import Action, Polkit
from testbed.bus import NOBODY, start_private_bus, this_thread_as
from testbed.daemon import Client
from testbed.net import link, temp_netns, users_netns
from testbed.polkit import start_polkitd

# 6b: nobody takes shares and releases its own (docs/rootless.md's rule, by user)
USER_SHARES = """
polkit.addRule(function(action, subject) {
    var granted = ["io.rdmad1.claim-share", "io.rdmad1.release-own"];
    if (subject.user == "nobody" && granted.indexOf(action.id) >= 0)
        return polkit.Result.YES;
});
"""


def check_released(netns: str) -> None:
    assert link(NS_IFNAME, netns) is None, f"{NS_IFNAME} still in {netns}"


async def run(bus: str, p: Params, res: Results, out: Path) -> None:
    with many_veths(1, "m", up=True) as nics, temp_netns("rbm") as netns:
        parent = nics.hosts[0]
        opts = claim_options(NS_IFNAME, NS_MTU, [NS_ADDR], shared=True)
        async with (
            Raw(parent, netns, shared=True) as raw,
            rdmad(bus, nics.sim_spec()),
            client(bus) as c,
        ):
            ways: Ways = {
                "r": claim_cycle(c, "sim0", netns, opts),
                "w": (raw.claim, raw.release),
            }
            t = await side_by_side(
                ways, p.shared_reps, p.warmup, Settler(p),
                lambda: check_claimed(netns, "macvlan"), lambda: check_released(netns),
            )  # fmt: skip
    for op, label in (("c", "claim"), ("r", "release")):
        r, w = t["r" + op], t["w" + op]
        res.dists[f"Shared {label}: rdmad"] = r
        res.dists[f"Shared {label}: raw pyroute2"] = w
        check = RatioCheck.of("rdmad/raw", r, w, 1.3)
        scenario = f"6. Shared {label} (macvlan), settled"
        res.rows.append(Row.of(scenario, spread(r), spread(w), check, judged=op == "c"))
    await run_as_a_user(p, res)


async def run_as_a_user(p: Params, res: Results) -> None:
    """6b: a user's share beside root's, settled; then the polkit round trip alone."""
    settle = Settler(p)
    opts = claim_options(NS_IFNAME, NS_MTU, [NS_ADDR], shared=True)
    with (
        many_veths(1, "u", up=True) as nics,
        users_netns(NOBODY) as netns,
        start_private_bus() as bus,
        start_polkitd(bus, USER_SHARES),
    ):
        async with rdmad(bus.address, nics.sim_spec()) as _d, client(bus.address) as root:
            with this_thread_as(NOBODY):  # the bus records the connection's uid at connect
                user = await Client.connect(bus.address, signals=False)
            try:
                ways: Ways = {
                    "r": claim_cycle(root, "sim0", netns, opts),
                    "u": claim_cycle(user, "sim0", netns, opts),
                }
                checks = (lambda: check_claimed(netns, "macvlan"), lambda: check_released(netns))
                t = await side_by_side(ways, p.shared_reps, p.warmup, settle, *checks)
                polkit, asked = Polkit(root.bus), []
                details, sender = {"device": "sim0", "netns": netns}, user.bus.unique_name
                assert sender is not None
                for _ in range(p.shared_reps):
                    await settle()
                    t0 = time.perf_counter()
                    await polkit.check(sender, Action.CLAIM_SHARE, details, False)
                    asked.append(ms_since(t0))
            finally:
                user.close()
    u, r = t["uc"], t["rc"]
    res.dists["Shared claim: a user polkit allows"] = u
    res.dists["Shared claim: root, beside it"] = r
    res.dists["polkit CheckAuthorization"] = asked
    ratio = RatioCheck.of("user/root", u, r, 1.0).text()
    text = f"root {spread(r)}; polkit round trip {spread(asked)}; {ratio}"
    res.rows.append(Row("6b. Shared claim as a user polkit allows, settled", spread(u), ratio=text))
