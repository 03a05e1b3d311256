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

// addRoute adds an IPAM result's route: dst through gateway ("" for a route through the
// link alone), with the 1.1.0 result's priority, table and scope when it has them, as the
// reference plugins' ipam.ConfigureIface does.
func (n *nsLinks) addRoute(route map[string]any, gateway string, link netlink.Link) error {
	dst, _ := route["dst"].(string)
	_, network, err := net.ParseCIDR(dst)
	if err != nil {
		return fmt.Errorf("route %q: %v", dst, err)
	}
	r := &netlink.Route{
		LinkIndex: link.Attrs().Index,
		Dst:       network,
		Protocol:  rtprotBoot,
		Scope:     netlink.SCOPE_LINK,
	}
	if gateway != "" {
		r.Gw = net.ParseIP(gateway)
		if r.Gw == nil {
			return fmt.Errorf("route %s: gateway %q is not an address", dst, gateway)
		}
		r.Scope = netlink.SCOPE_UNIVERSE
	}
	for key, into := range map[string]*int{"priority": &r.Priority, "table": &r.Table} {
		if value, present := route[key]; present {
			v, ok := integer(value)
			if !ok || v < 0 || v > 1<<32-1 {
				return fmt.Errorf("route %s: %s %v is not a uint32", dst, key, value)
			}
			*into = int(v)
		}
	}
	if value, present := route["scope"]; present {
		v, ok := integer(value)
		if !ok || v < 0 || v > 255 {
			return fmt.Errorf("route %s: scope %v is not a uint8", dst, value)
		}
		r.Scope = netlink.Scope(v)
	}
	return n.handle.RouteAdd(r)
}
