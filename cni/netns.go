package main

import (
	"fmt"
	"net"
	"syscall"

	"github.com/containernetworking/cni/pkg/types"
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
	hw, err := net.ParseMAC(mac) // checked in NetConf.check
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

// addRoute adds an IPAM result's route: through gateway (nil: through the link alone),
// with the 1.1.0 result's priority, table and scope when it has them, as the reference
// plugins' ipam.ConfigureIface does.
func (n *nsLinks) addRoute(route *types.Route, gateway net.IP, link netlink.Link) error {
	dst := route.Dst
	r := &netlink.Route{
		LinkIndex: link.Attrs().Index,
		Dst:       &net.IPNet{IP: dst.IP.Mask(dst.Mask), Mask: dst.Mask},
		Protocol:  rtprotBoot,
		Scope:     netlink.SCOPE_LINK,
		Priority:  route.Priority,
	}
	if gateway != nil {
		r.Gw = gateway
		r.Scope = netlink.SCOPE_UNIVERSE
	}
	if route.Table != nil {
		r.Table = *route.Table
	}
	if route.Scope != nil {
		r.Scope = netlink.Scope(*route.Scope)
	}
	return n.handle.RouteAdd(r)
}

// netnsID is the netns at path as rdmad names it: net:[INODE].
func netnsID(path string) (string, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("net:[%d]", st.Ino), nil
}
