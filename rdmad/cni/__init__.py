"""rdmad-cni: a CNI plugin (type "rdmad") that turns a runtime's ADD/DEL into rdmad claims.

A separate program from the daemon: one short process per verb, so its imports stay small
(jeepney for D-Bus, raw netlink for the netns side; no dbus-fast, pyroute2 or asyncio).
"""
