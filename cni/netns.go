package main

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// The container side of an attachment, read and completed over rtnetlink in its netns.
// rdmad puts the interface there (name, MTU, addresses, up); the plugin reads what the
// result reports (MAC, MTU) and adds what rdmad does not: routes and a requested MAC.

const rtprotBoot = 3 // what `ip route add` marks its routes with

type nsLinks struct {
	handle *netlink.Handle
}

// openNetns makes an rtnetlink socket inside the netns at path (the thread returns to its
// own netns at once: a socket keeps the netns it was made in).
func openNetns(path string) (*nsLinks, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	handle, err := netlink.NewHandleAt(ns, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	return &nsLinks{handle}, nil
}

func (n *nsLinks) close() { n.handle.Delete() }

func (n *nsLinks) link(name string) (netlink.Link, error) {
	return n.handle.LinkByName(name)
}

func (n *nsLinks) setMAC(link netlink.Link, mac string) error {
	hw, err := net.ParseMAC(mac) // checked in parseNetconf
	if err != nil {
		return err
	}
	return n.handle.LinkSetHardwareAddr(link, hw)
}

// addresses are the CIDRs on link, as "ADDRESS/PREFIX".
func (n *nsLinks) addresses(link netlink.Link) (map[string]bool, error) {
	addrs, err := n.handle.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, a := range addrs {
		ones, _ := a.Mask.Size()
		out[fmt.Sprintf("%s/%d", a.IP, ones)] = true
	}
	return out, nil
}

// addRoute adds dst through gateway ("" for a route through the link alone).
func (n *nsLinks) addRoute(dst, gateway string, link netlink.Link) error {
	_, network, err := net.ParseCIDR(dst)
	if err != nil {
		return fmt.Errorf("route %q: %v", dst, err)
	}
	route := &netlink.Route{
		LinkIndex: link.Attrs().Index,
		Dst:       network,
		Protocol:  rtprotBoot,
		Scope:     netlink.SCOPE_LINK,
	}
	if gateway != "" {
		route.Gw = net.ParseIP(gateway)
		if route.Gw == nil {
			return fmt.Errorf("route %s: gateway %q is not an address", dst, gateway)
		}
		route.Scope = netlink.SCOPE_UNIVERSE
	}
	return n.handle.RouteAdd(route)
}
