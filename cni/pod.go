package main

import (
	"fmt"
	"strings"
	"syscall"

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

func podUID(e *env) string { return e.Args["K8S_POD_UID"] }

// dra is the owner prefix of rdmad-dra's holds (rdmad/dra/prepare.py: dra/<claim UID>).
const draOwnerPrefix = "dra/"

func podAdd(e *env, conf *netConf, environ map[string]string) (map[string]any, error) {
	uid := podUID(e)
	if uid == "" {
		return buildResult(e, conf, nil, nil), nil // not a Kubernetes pod: nothing is held for it
	}
	var addresses map[string]any
	var err error
	ifname := ""
	if conf.IPAMType != "" {
		ifname = e.Ifname
		if addresses, err = runIPAM("ADD", e, conf, environ); err != nil {
			_, _ = runIPAM("DEL", e, conf, environ)
			return nil, err
		}
	}
	var result map[string]any
	err = withRdmad(conf, func(r *rdmad) error {
		claims, err := r.attach(uid, e.Netns, ifname, addresses)
		if err != nil {
			return err
		}
		result = buildResult(e, conf, nil, nil)
		interfaces := listOf(result["interfaces"])
		for _, c := range claims {
			if c.Ifname != "" {
				interfaces = append(interfaces, map[string]any{"name": c.Ifname, "sandbox": e.Netns})
			}
		}
		result["interfaces"] = interfaces
		if ifname != "" && len(claims) == 1 && claims[0].Ifname != "" {
			index := len(interfaces) - 1
			for _, item := range listOf(addresses["ips"]) {
				ip := copyObject(item)
				delete(ip, "version")
				ip["interface"] = index
				result["ips"] = append(listOf(result["ips"]), ip)
			}
			result["routes"] = append(listOf(result["routes"]), listOf(addresses["routes"])...)
		}
		return nil
	})
	if err != nil && conf.IPAMType != "" {
		_, _ = runIPAM("DEL", e, conf, environ) // the lease goes with the failed ADD
	}
	return result, err
}

// podDel detaches the holds attached to the pod's netns: found by the netns's inode among
// rdmad's claims (one ListClaims call). No netns left (a DEL after the runtime deleted
// it) is nothing to do: rdmad held those claims again when it died.
func podDel(e *env, conf *netConf, environ map[string]string) error {
	var ipamErr error
	if conf.IPAMType != "" {
		_, ipamErr = runIPAM("DEL", e, conf, environ)
	}
	var st syscall.Stat_t
	if e.Netns == "" || syscall.Stat(e.Netns, &st) != nil {
		return ipamErr
	}
	netns := fmt.Sprintf("net:[%d]", st.Ino)
	err := withRdmad(conf, func(r *rdmad) error {
		rows, err := r.claims()
		for _, c := range rows {
			if c.Netns == netns && strings.HasPrefix(c.Owner, draOwnerPrefix) &&
				(conf.IPAMType == "" || c.Ifname == e.Ifname) {
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
func (r *rdmad) attach(podUID, netns, ifname string, addresses map[string]any) ([]claimRow, error) {
	options := map[string]dbus.Variant{}
	if ifname != "" {
		options["ifname"] = dbus.MakeVariant(ifname)
	}
	if ips := listOf(addresses["ips"]); len(ips) > 0 {
		cidrs := []string{}
		for _, ip := range ips {
			address, _ := copyObject(ip)["address"].(string)
			cidrs = append(cidrs, address)
		}
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
