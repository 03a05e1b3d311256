package main

import (
	"strings"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/godbus/dbus"
)

// Pod mode ("pod": true): the devices rdmad holds for the pod (Manager.Hold, made by
// rdmad-dra when the kubelet prepared the pod's ResourceClaims) are attached to its netns
// (Manager.Attach), found by the pod's UID, K8S_POD_UID in CNI_ARGS. Chained after the
// node's network plugin it attaches all of them and passes prevResult on; through Multus,
// with IPAM, only the hold whose interface name is CNI_IFNAME, with the IPAM addresses.
// A pod with nothing held costs one D-Bus call (none without K8S_POD_UID). DEL detaches
// the claims rdmad-dra's holds became in the pod's netns (Manager.Detach), so that each
// device comes home as it left (before the runtime deletes the netns, which would take a
// veth or a macvlan child with it) and stays held for the pod: the kubelet makes a new
// sandbox for the same pod without preparing its claims again, and the new sandbox's ADD
// attaches them. Only the kubelet's unprepare (rdmad-dra's Release) ends them. DEL gives
// the IPAM lease back.

// dra is the owner prefix of rdmad-dra's holds (rdmad/dra/prepare.py: dra/<claim UID>).
const draOwnerPrefix = "dra/"

func podAdd(e *env, conf *NetConf) (*current.Result, error) {
	uid := string(e.K8S.K8S_POD_UID)
	if uid == "" {
		return chained(conf.prev), nil // not a Kubernetes pod: nothing is held for it
	}
	var addresses *current.Result
	var err error
	ifname := ""
	if conf.IPAM.Type != "" {
		ifname = e.IfName
		if addresses, err = ipamAdd(conf.IPAM.Type, e.StdinData); err != nil {
			return nil, err
		}
	}
	var result *current.Result
	err = withRdmad(&conf.Network, func(r *rdmad) error {
		claims, err := r.attach(uid, e.Netns, ifname, addresses)
		if err != nil {
			return err
		}
		result = chained(conf.prev)
		for _, c := range claims {
			if c.Ifname != "" {
				result.Interfaces = append(result.Interfaces, &current.Interface{Name: c.Ifname, Sandbox: e.Netns})
			}
		}
		if ifname != "" && len(claims) == 1 && claims[0].Ifname != "" {
			withAddresses(result, addresses)
		}
		return nil
	})
	if err != nil && conf.IPAM.Type != "" {
		_ = ipam(invoke.DelegateDel, conf.IPAM.Type, e.StdinData) // the lease goes with the failed ADD
	}
	return result, err
}

// podDel detaches the holds attached to the pod's netns: found by the netns's inode among
// rdmad's claims (one ListClaims call). No netns left (a DEL after the runtime deleted
// it) is nothing to do: rdmad held those claims again when it died.
func podDel(args *skel.CmdArgs, n *Network) error {
	var ipamErr error
	if n.IPAM.Type != "" {
		ipamErr = ipam(invoke.DelegateDel, n.IPAM.Type, args.StdinData)
	}
	netns, statErr := netnsID(args.Netns)
	if args.Netns == "" || statErr != nil {
		return ipamErr
	}
	err := withRdmad(n, func(r *rdmad) error {
		rows, err := r.claims()
		for _, c := range rows {
			if c.Netns == netns && strings.HasPrefix(c.Owner, draOwnerPrefix) &&
				(n.IPAM.Type == "" || c.Ifname == args.IfName) {
				if _, err := r.detach(c.ID); err != nil {
					return err
				}
			}
		}
		return err
	})
	if ipamErr != nil {
		return ipamErr
	}
	return err
}

// attach is Manager.Attach: the pod's claims now in netns, as ListClaims lists them.
func (r *rdmad) attach(podUID, netns, ifname string, addresses *current.Result) ([]claimRow, error) {
	options := map[string]dbus.Variant{}
	if ifname != "" {
		options["ifname"] = dbus.MakeVariant(ifname)
	}
	if cidrs := cidrsOf(addresses); len(cidrs) > 0 {
		options["addresses"] = dbus.MakeVariant(cidrs)
	}
	var paths []dbus.ObjectPath
	if err := r.call(rootPath, manager+".Attach", []any{&paths}, podUID, netns, options); err != nil {
		return nil, err
	}
	out := make([]claimRow, 0, len(paths))
	for _, path := range paths {
		row, err := r.claimAt(path)
		if err != nil {
			return nil, err
		}
		out = append(out, row)
	}
	return out, nil
}
