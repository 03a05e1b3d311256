"""ADD, DEL, CHECK, GC and STATUS: each a few rdmad calls around the IPAM plugin.

rdmad is the only record: a claim's owner names its attachment (config.attachment_owner),
so DEL, CHECK and GC find it after a reboot, a daemon restart or a lost cache.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from rdmad.cni import ipam
from rdmad.cni.client import ERROR_CODES, ClaimRow, Device, Rdmad, bus_address
from rdmad.cni.config import Env, NetConf, Selector, attachment_owner, parse_owner
from rdmad.cni.netlink import Link, NetnsLinks
from rdmad.cni.spec import (
    INVALID_CONFIG,
    IO_FAILURE,
    NOT_AVAILABLE,
    TRY_AGAIN_LATER,
    CniError,
)

CHECK_FAILED = 120  # CHECK found the attachment incomplete (claim, interface or address gone)
DEVICE_BUSY = ERROR_CODES["io.rdmad1.Error.DeviceBusy"]
NO_SUCH_DEVICE = ERROR_CODES["io.rdmad1.Error.NoSuchDevice"]
# A CDI device name (the CDI spec's rule, kept to what CDI 0.5.0 readers accept).
_CDI_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.\-]*[A-Za-z0-9])?$")
DEVICE_INFO_VERSION = "1.1.0"


@contextmanager
def connected(conf: NetConf) -> Iterator[Rdmad]:
    rdmad = Rdmad.connect(bus_address(conf.bus_address))
    try:
        yield rdmad
    finally:
        rdmad.close()


def _owned(rdmad: Rdmad, owner: str) -> list[ClaimRow]:
    return [c for c in rdmad.claims() if c.owner == owner]


def cdi_name(env: Env) -> str:
    """The extra CDI device name of an attachment, derivable before the container starts:
    [K8S_POD_NAMESPACE.]K8S_POD_NAME.IFNAME (podman passes the container's name as
    K8S_POD_NAME), else CONTAINERID.IFNAME. "" if that is not a valid CDI name."""
    pod = env.args.get("K8S_POD_NAME", "")
    base = ".".join(p for p in (env.args.get("K8S_POD_NAMESPACE", ""), pod) if p) if pod else ""
    name = f"{base or env.container_id}.{env.ifname}"
    return name if _CDI_NAME.match(name) and len(name) <= 253 else ""


def add(env: Env, conf: NetConf, environ: dict[str, str]) -> dict[str, Any]:
    owner = attachment_owner(conf.name, env.container_id, env.ifname)
    if len(owner.encode()) > 256:
        raise CniError(
            INVALID_CONFIG, "network name and container id are too long for a claim's owner"
        )
    with connected(conf) as rdmad:
        if _owned(rdmad, owner):
            raise CniError(
                DEVICE_BUSY, f"{env.container_id} already has {env.ifname} on network {conf.name}"
            )
        devices = [conf.device] if conf.device else _candidates(rdmad, conf)
        addresses = ipam.run("ADD", env, conf, environ) if conf.ipam_type else None
        try:
            claim = _claim_first(rdmad, devices, env, conf, owner, addresses)
            try:
                link = _complete(env, conf, claim, addresses)
                if conf.device_info_file:
                    _write_device_info(rdmad, conf.device_info_file, claim)
            except BaseException:
                rdmad.release(claim.id)
                raise
        except BaseException:
            if conf.ipam_type:
                with suppress(CniError):
                    ipam.run("DEL", env, conf, environ)
            raise
    return _result(env, conf, link, addresses)


def _candidates(rdmad: Rdmad, conf: NetConf) -> list[str]:
    """Devices the config's deviceID or selector picks, best first: for a shared claim the
    one with the fewest claims. NoSuchDevice/DeviceBusy codes when none fits."""
    devices = rdmad.devices()
    if conf.device_id:
        # The device the runtime allocated, whatever its state: rdmad says if it is busy
        # (and after sriov-cni moved its netdev, it shows "unavailable" yet can be claimed
        # with netdev=false).
        named = [d.name for d in devices if d.pci_address.lower() == conf.device_id.lower()]
        if not named:
            raise CniError(NO_SUCH_DEVICE, f"no RDMA device at PCI address {conf.device_id}")
        return named
    assert conf.selector is not None
    matching = [d for d in devices if _selected(d, conf.selector)]
    wanted = f"matching the selector of network {conf.name}"
    if not matching:
        raise CniError(NO_SUCH_DEVICE, f"no RDMA device {wanted}")
    usable = ("available", "shared") if conf.shared else ("available",)
    free = sorted((d for d in matching if d.state in usable), key=lambda d: (d.claims, d.name))
    if not free:
        raise CniError(DEVICE_BUSY, f"every RDMA device {wanted} is in use")
    return [d.name for d in free]


def _selected(d: Device, s: Selector) -> bool:
    return (
        (not s.driver or d.driver == s.driver)
        and (not s.link_layer or d.link_layer.lower() == s.link_layer.lower())
        and (not s.netdev or d.netdev == s.netdev)
        and (s.numa_node is None or d.numa_node == s.numa_node)
        and (not s.pci_address or d.pci_address.lower().startswith(s.pci_address.lower()))
    )


def _claim_first(
    rdmad: Rdmad,
    devices: list[str],
    env: Env,
    conf: NetConf,
    owner: str,
    addresses: dict[str, Any] | None,
) -> ClaimRow:
    """Claim the first device that is still free (another pod may take one meanwhile)."""
    options: dict[str, tuple[str, Any]] = {"owner": ("s", owner), "shared": ("b", conf.shared)}
    if conf.netdev:
        options["ifname"] = ("s", env.ifname)
    else:
        options["netdev"] = ("b", False)
    if conf.mtu is not None:
        options["mtu"] = ("u", conf.mtu)
    if conf.chardevs:
        options["chardevs"] = ("as", list(conf.chardevs))
    if addresses:
        options["addresses"] = ("as", [ip["address"] for ip in addresses.get("ips", [])])
    name = cdi_name(env)
    if name:
        options["cdi_name"] = ("s", name)
    for i, device in enumerate(devices):
        try:
            return rdmad.claim(device, env.netns, options)
        except CniError as exc:
            if exc.code != DEVICE_BUSY or i == len(devices) - 1:
                raise
    raise AssertionError("no device to claim")  # _candidates never returns an empty list


def _complete(
    env: Env, conf: NetConf, claim: ClaimRow, addresses: dict[str, Any] | None
) -> Link | None:
    """What rdmad does not do in the netns: the MAC asked for, the IPAM routes."""
    if not conf.netdev:
        return None
    try:
        links = NetnsLinks(env.netns)
    except OSError as exc:
        raise CniError(IO_FAILURE, f"cannot enter netns {env.netns}", str(exc)) from None
    try:
        link = links.link(claim.ifname)
        if conf.mac:
            links.set_mac(link.ifindex, conf.mac)
            link = links.link(claim.ifname)
        for route in (addresses or {}).get("routes", []):
            gateway = route.get("gw") or _gateway_for(route["dst"], addresses or {})
            links.add_route(route["dst"], gateway, link.ifindex)
        return link
    except OSError as exc:
        raise CniError(
            IO_FAILURE, f"cannot configure {claim.ifname} in {env.netns}", str(exc)
        ) from None
    finally:
        links.close()


def _gateway_for(dst: str, addresses: dict[str, Any]) -> str:
    """A route without "gw" goes through the gateway IPAM gave the same family, as the
    reference plugins' ipam.ConfigureIface does; through the link when there is none."""
    version = ipaddress.ip_network(dst, strict=False).version
    for ip in addresses.get("ips", []):
        gw = ip.get("gateway", "")
        if gw and ipaddress.ip_address(gw).version == version:
            return str(gw)
    return ""


def _write_device_info(rdmad: Rdmad, path: str, claim: ClaimRow) -> None:
    """Multus' device-info file (k8snetworkplumbingwg device-info-spec), type pci."""
    devices = rdmad.devices()
    pci = next((d.pci_address for d in devices if d.name == claim.device), "")
    info = {
        "type": "pci",
        "version": DEVICE_INFO_VERSION,
        "pci": {"pci-address": pci, "rdma-device": claim.device},
    }
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as out:
            json.dump(info, out)
    except OSError as exc:
        raise CniError(IO_FAILURE, f"cannot write CNIDeviceInfoFile {path}", str(exc)) from None


def _result(
    env: Env, conf: NetConf, link: Link | None, addresses: dict[str, Any] | None
) -> dict[str, Any]:
    """Our interface and IPAM's addresses after the previous plugins' (chaining)."""
    prev = conf.prev_result or {}
    interfaces = list(prev.get("interfaces", []))
    ips = list(prev.get("ips", []))
    routes = list(prev.get("routes", []))
    if link is not None:
        interfaces.append(
            {"name": link.name, "mac": link.mac, "mtu": link.mtu, "sandbox": env.netns}
        )
        index = len(interfaces) - 1
        for ip in (addresses or {}).get("ips", []):
            ips.append({k: v for k, v in ip.items() if k != "version"} | {"interface": index})
        routes += (addresses or {}).get("routes", [])
    result: dict[str, Any] = {"interfaces": interfaces, "ips": ips, "routes": routes}
    dns = (addresses or {}).get("dns") or prev.get("dns")
    if dns:
        result["dns"] = dns
    return result


def delete(env: Env, conf: NetConf, environ: dict[str, str]) -> None:
    """Idempotent: no claim (never made, released, netns gone) is success. rdmad out of
    reach is not: the runtime sees "try again later"."""
    if conf.ipam_type:
        ipam.run("DEL", env, conf, environ)
    owner = attachment_owner(conf.name, env.container_id, env.ifname)
    with connected(conf) as rdmad:
        for claim in _owned(rdmad, owner):
            rdmad.release(claim.id)


def check(env: Env, conf: NetConf, environ: dict[str, str]) -> None:
    owner = attachment_owner(conf.name, env.container_id, env.ifname)
    with connected(conf) as rdmad:
        claims = _owned(rdmad, owner)
    if not claims:
        raise CniError(CHECK_FAILED, f"no rdmad claim for {env.ifname} of {env.container_id}")
    try:
        inode = os.stat(env.netns).st_ino
    except OSError as exc:
        raise CniError(CHECK_FAILED, f"netns {env.netns} is gone", str(exc)) from None
    if claims[0].netns != f"net:[{inode}]":
        raise CniError(
            CHECK_FAILED, f"claim {claims[0].id} is in {claims[0].netns}, not {env.netns}"
        )
    if conf.netdev:
        _check_interface(env, conf)
    if conf.ipam_type:
        ipam.run("CHECK", env, conf, environ)


def _check_interface(env: Env, conf: NetConf) -> None:
    prev = conf.prev_result or {}
    links = NetnsLinks(env.netns)
    try:
        try:
            link = links.link(env.ifname)
        except OSError:
            raise CniError(
                CHECK_FAILED, f"interface {env.ifname} is gone from {env.netns}"
            ) from None
        have = links.addresses(link.ifindex)
    finally:
        links.close()
    interfaces = prev.get("interfaces", [])
    ours = {i for i, f in enumerate(interfaces) if f.get("name") == env.ifname and f.get("sandbox")}
    for i in ours:
        mac = interfaces[i].get("mac", "")
        if mac and mac.lower() != link.mac:
            raise CniError(CHECK_FAILED, f"{env.ifname} has MAC {link.mac}, not {mac}")
    for ip in prev.get("ips", []):
        if ip.get("interface") in ours:
            want = ipaddress.ip_interface(ip["address"]).with_prefixlen
            if want not in have:
                raise CniError(CHECK_FAILED, f"{env.ifname} lost its address {want}")


def gc(env: Env, conf: NetConf, environ: dict[str, str]) -> None:
    """Release this network's claims whose attachment the runtime no longer lists, and free
    each one's IPAM lease with the IPAM plugin's DEL for that attachment (Debian's IPAM
    plugins have no GC verb)."""
    valid = set(conf.valid_attachments)
    with connected(conf) as rdmad:
        for claim in rdmad.claims():
            parsed = parse_owner(claim.owner)
            if parsed is None or parsed[0] != conf.name:
                continue
            _, container, ifname = parsed
            if (container, ifname) in valid or (container, "") in valid:
                continue
            rdmad.release(claim.id)
            if conf.ipam_type:
                attachment = {"CNI_CONTAINERID": container, "CNI_IFNAME": ifname}
                ipam.run("DEL", env, conf, {**environ, **attachment, "CNI_NETNS": ""})


def status(conf: NetConf) -> None:
    try:
        with connected(conf) as rdmad:
            rdmad.version()
    except CniError as exc:
        if exc.code == TRY_AGAIN_LATER:
            raise CniError(
                NOT_AVAILABLE, "rdmad is not available", exc.details or exc.msg
            ) from None
        raise
