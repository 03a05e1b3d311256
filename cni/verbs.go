package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/godbus/dbus"
)

// ADD and DEL (CHECK, GC and STATUS: check.go): each a few rdmad calls around the IPAM
// plugin. rdmad is the only record: a claim's owner names its attachment (attachmentOwner), so
// DEL, CHECK and GC find it after a reboot, a daemon restart or a lost cache.

// A CDI device name (the CDI spec's rule, kept to what CDI 0.5.0 readers accept).
var cdiNamePattern = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9_.\-]*[A-Za-z0-9])?$`)

const deviceInfoVersion = "1.1.0"

func cmdAdd(args *skel.CmdArgs) error {
	e, err := newEnv(args)
	if err != nil {
		return err
	}
	conf, err := loadNetConf(args.StdinData)
	if err != nil {
		return err
	}
	var result *current.Result
	if conf.Pod {
		result, err = podAdd(e, conf)
	} else {
		result, err = add(e, conf)
	}
	if err != nil {
		return err
	}
	return types.PrintResult(result, conf.CNIVersion)
}

func cmdDel(args *skel.CmdArgs) error {
	n, err := loadNetwork(args.StdinData)
	if err != nil {
		return err
	}
	if n.Pod {
		return podDel(args, n)
	}
	return del(args, n)
}

func withRdmad(n *Network, fn func(*rdmad) error) error {
	r, err := connect(busAddress(n.BusAddress))
	if err != nil {
		return err
	}
	defer r.close()
	return fn(r)
}

func owned(r *rdmad, owner string) ([]claimRow, error) {
	rows, err := r.claims()
	var out []claimRow
	for _, c := range rows {
		if c.Owner == owner {
			out = append(out, c)
		}
	}
	return out, err
}

// podCdiName is the CDI device name of all the attachments of a pod (one netns), derivable
// before the container starts: [K8S_POD_NAMESPACE.]K8S_POD_NAME (podman passes the
// container's name as K8S_POD_NAME), else CONTAINERID. "" if that is not a valid CDI name.
func podCdiName(e *env) string {
	name := e.ContainerID
	if pod := string(e.K8S.K8S_POD_NAME); pod != "" {
		name = pod
		if ns := string(e.K8S.K8S_POD_NAMESPACE); ns != "" {
			name = ns + "." + pod
		}
	}
	return validCdiName(name)
}

// cdiName is the extra CDI device name of one attachment: its pod's name, "." and IFNAME.
func cdiName(e *env) string {
	if pod := podCdiName(e); pod != "" {
		return validCdiName(pod + "." + e.IfName)
	}
	return ""
}

func validCdiName(name string) string {
	if !cdiNamePattern.MatchString(name) || len(name) > 253 {
		return ""
	}
	return name
}

func add(e *env, conf *NetConf) (*current.Result, error) {
	owner := attachmentOwner(conf.Name, e.ContainerID, e.IfName)
	if len(owner) > ownerMaxBytes {
		return nil, invalid("network name and container id are too long for a claim's owner")
	}
	options, err := conf.Limits.options(string(e.K8S.K8S_POD_UID), cgroupMount)
	if err != nil {
		return nil, err
	}
	options["owner"] = dbus.MakeVariant(owner)
	var result *current.Result
	err = withRdmad(&conf.Network, func(r *rdmad) error {
		mine, err := owned(r, owner)
		if err != nil {
			return err
		}
		if len(mine) > 0 {
			return types.NewError(codeDeviceBusy,
				fmt.Sprintf("%s already has %s on network %s", e.ContainerID, e.IfName, conf.Name), "")
		}
		devices := []string{conf.Device}
		if conf.Device == "" {
			if devices, err = candidates(r, conf); err != nil {
				return err
			}
		}
		var addresses *current.Result
		if conf.IPAM.Type != "" {
			if addresses, err = ipamAdd(conf.IPAM.Type, e.StdinData); err != nil {
				return err
			}
		}
		result, err = attach(r, devices, e, conf, options, addresses)
		if err != nil && conf.IPAM.Type != "" {
			_ = ipam(invoke.DelegateDel, conf.IPAM.Type, e.StdinData) // the lease goes with the failed ADD
		}
		return err
	})
	return result, err
}

// attach claims a device with options (the owner and the limits, to which the config's
// others are added) and completes the interface; a failure after the claim releases it.
func attach(r *rdmad, devices []string, e *env, conf *NetConf, options map[string]dbus.Variant, addresses *current.Result) (*current.Result, error) {
	claim, err := claimFirst(r, devices, e, conf, options, addresses)
	if err != nil {
		return nil, err
	}
	iface, err := complete(e, conf, claim, addresses)
	if err == nil && conf.DeviceInfoFile != "" {
		err = writeDeviceInfo(r, conf.DeviceInfoFile, claim)
	}
	if err != nil {
		_, _ = r.release(claim.ID)
		return nil, err
	}
	result := chained(conf.prev)
	if iface != nil {
		result.Interfaces = append(result.Interfaces, iface)
		withAddresses(result, addresses)
	}
	return result, nil
}

// candidates are the devices the config's deviceID or selector picks, best first: for a
// shared claim the one with the fewest claims.
func candidates(r *rdmad, conf *NetConf) ([]string, error) {
	devices, err := r.devices()
	if err != nil {
		return nil, err
	}
	if conf.DeviceID != "" {
		// The device the runtime allocated, whatever its state: rdmad says if it is busy
		// (and after sriov-cni moved its netdev, it shows "unavailable" yet can be claimed
		// with netdev=false).
		var named []string
		for _, d := range devices {
			if strings.EqualFold(d.PCIAddress, conf.DeviceID) {
				named = append(named, d.Name)
			}
		}
		if len(named) == 0 {
			return nil, types.NewError(codeNoSuchDevice, "no RDMA device at PCI address "+conf.DeviceID, "")
		}
		sort.Strings(named)
		return named, nil
	}
	wanted := "matching the selector of network " + conf.Name
	var matching, free []device
	for _, d := range devices {
		if selected(d, conf.Selector) {
			matching = append(matching, d)
			if d.State == "available" || (conf.Shared && d.State == "shared") {
				free = append(free, d)
			}
		}
	}
	if len(matching) == 0 {
		return nil, types.NewError(codeNoSuchDevice, "no RDMA device "+wanted, "")
	}
	if len(free) == 0 {
		return nil, types.NewError(codeDeviceBusy, "every RDMA device "+wanted+" is in use", "")
	}
	sort.Slice(free, func(i, j int) bool {
		if free[i].Claims != free[j].Claims {
			return free[i].Claims < free[j].Claims
		}
		return free[i].Name < free[j].Name
	})
	names := make([]string, len(free))
	for i, d := range free {
		names[i] = d.Name
	}
	return names, nil
}

func selected(d device, s *Selector) bool {
	return (s.Driver == "" || d.Driver == s.Driver) &&
		(s.LinkLayer == "" || strings.EqualFold(d.LinkLayer, s.LinkLayer)) &&
		(s.Netdev == "" || d.Netdev == s.Netdev) &&
		(s.NumaNode == nil || d.NumaNode == *s.NumaNode) &&
		(s.PCIAddress == "" || strings.HasPrefix(strings.ToLower(d.PCIAddress), strings.ToLower(s.PCIAddress)))
}

// claimFirst claims the first device that is still free (another pod may take one meanwhile).
func claimFirst(r *rdmad, devices []string, e *env, conf *NetConf, options map[string]dbus.Variant, addresses *current.Result) (claimRow, error) {
	options["shared"] = dbus.MakeVariant(conf.Shared)
	if conf.hasNetdev() {
		options["ifname"] = dbus.MakeVariant(e.IfName)
	} else {
		options["netdev"] = dbus.MakeVariant(false)
	}
	if conf.MTU != nil {
		options["mtu"] = dbus.MakeVariant(uint32(*conf.MTU))
	}
	if len(conf.Chardevs) > 0 {
		options["chardevs"] = dbus.MakeVariant(conf.Chardevs)
	}
	if cidrs := cidrsOf(addresses); len(cidrs) > 0 {
		options["addresses"] = dbus.MakeVariant(cidrs)
	}
	if name := cdiName(e); name != "" {
		options["cdi_name"] = dbus.MakeVariant(name)
	}
	if name := podCdiName(e); name != "" {
		options["pod_cdi_name"] = dbus.MakeVariant(name)
	}
	if conf.PolicyRouting {
		options["table"] = dbus.MakeVariant(uint32(0)) // rdmad picks the pod's next free table
		options["routes"] = dbus.MakeVariant(tableRoutes(addresses))
	}
	var err error
	for _, dev := range devices {
		var claim claimRow
		if claim, err = r.claim(dev, e.Netns, options); err == nil {
			return claim, nil
		}
		var cerr *types.Error
		if !errors.As(err, &cerr) || cerr.Code != codeDeviceBusy {
			return claimRow{}, err
		}
	}
	return claimRow{}, err
}

// cidrsOf are the IPAM result's addresses as rdmad's addresses option takes them.
func cidrsOf(addresses *current.Result) []string {
	var out []string
	if addresses != nil {
		for _, ip := range addresses.IPs {
			out = append(out, ip.Address.String())
		}
	}
	return out
}

// complete does what rdmad does not do in the netns: the MAC asked for, the IPAM routes;
// it returns the interface as the result lists it (none with netdev=false).
func complete(e *env, conf *NetConf, claim claimRow, addresses *current.Result) (*current.Interface, error) {
	if !conf.hasNetdev() {
		return nil, nil
	}
	links, err := openNetns(e.Netns)
	if err != nil {
		return nil, types.NewError(types.ErrIOFailure, "cannot enter netns "+e.Netns, err.Error())
	}
	defer links.close()
	failed := func(err error) error {
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("cannot configure %s in %s", claim.Ifname, e.Netns), err.Error())
	}
	link, err := links.link(claim.Ifname)
	if err != nil {
		return nil, failed(err)
	}
	if mac := conf.RuntimeConfig.MAC; mac != "" {
		if err := links.setMAC(link, mac); err != nil {
			return nil, failed(err)
		}
		if link, err = links.link(claim.Ifname); err != nil {
			return nil, failed(err)
		}
	}
	if !conf.PolicyRouting && addresses != nil { // else the IPAM routes are in the claim's table
		for _, route := range addresses.Routes {
			if err := links.addRoute(route, gatewayFor(route, addresses), link); err != nil {
				return nil, failed(err)
			}
		}
	}
	attrs := link.Attrs()
	return &current.Interface{Name: attrs.Name, Mac: attrs.HardwareAddr.String(), Mtu: attrs.MTU, Sandbox: e.Netns}, nil
}

// tableRoutes are the IPAM result's routes as rdmad's routes option takes them,
// DST[,via=GW], each through its own gateway or else the one IPAM gave its family.
func tableRoutes(addresses *current.Result) []string {
	out := []string{}
	if addresses == nil {
		return out
	}
	for _, route := range addresses.Routes {
		dst := route.Dst.String()
		if gw := gatewayFor(route, addresses); gw != nil {
			dst += ",via=" + gw.String()
		}
		out = append(out, dst)
	}
	return out
}

// gatewayFor: a route's own gateway, else the one IPAM gave the same family, as the
// reference plugins' ipam.ConfigureIface does; nil (through the link) when there is none.
func gatewayFor(route *types.Route, addresses *current.Result) net.IP {
	if route.GW != nil {
		return route.GW
	}
	v4 := route.Dst.IP.To4() != nil
	for _, ip := range addresses.IPs {
		if ip.Gateway != nil && (ip.Gateway.To4() != nil) == v4 {
			return ip.Gateway
		}
	}
	return nil
}

// writeDeviceInfo writes Multus' device-info file (k8snetworkplumbingwg device-info-spec), type pci,
// where there is none: one that exists is the device plugin's, which Multus copied there
// (the spec lets a CNI plugin read it, and write only a missing one), and says more than
// this one would (the PF's PCI address, the representor).
func writeDeviceInfo(r *rdmad, path string, claim claimRow) error {
	if _, err := os.Lstat(path); err == nil {
		return nil
	}
	devices, err := r.devices()
	if err != nil {
		return err
	}
	pci := ""
	for _, d := range devices {
		if d.Name == claim.Device {
			pci = d.PCIAddress
		}
	}
	info, _ := json.Marshal(map[string]any{
		"type":    "pci",
		"version": deviceInfoVersion,
		"pci":     map[string]string{"pci-address": pci, "rdma-device": claim.Device},
	})
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return types.NewError(types.ErrIOFailure, "cannot write CNIDeviceInfoFile "+path, err.Error())
	}
	if err := os.WriteFile(path, info, 0o644); err != nil {
		return types.NewError(types.ErrIOFailure, "cannot write CNIDeviceInfoFile "+path, err.Error())
	}
	return nil
}

// chained is a new result that starts with the previous plugins' (chaining).
func chained(prev *current.Result) *current.Result {
	result := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	if prev != nil {
		result.Interfaces = append(result.Interfaces, prev.Interfaces...)
		result.IPs = append(result.IPs, prev.IPs...)
		result.Routes = append(result.Routes, prev.Routes...)
		result.DNS = prev.DNS
	}
	return result
}

// withAddresses adds IPAM's addresses to the result's last interface, and its routes and
// DNS (which replaces the previous plugins' when it says anything).
func withAddresses(result *current.Result, addresses *current.Result) {
	if addresses == nil {
		return
	}
	index := len(result.Interfaces) - 1
	for _, ip := range addresses.IPs {
		ip = ip.Copy()
		ip.Interface = current.Int(index)
		result.IPs = append(result.IPs, ip)
	}
	result.Routes = append(result.Routes, addresses.Routes...)
	if !addresses.DNS.IsEmpty() {
		result.DNS = addresses.DNS
	}
}

// del is idempotent: no claim (never made, released, netns gone) is success. rdmad out of
// reach is not: the runtime sees "try again later". It is best effort, as the spec asks: a
// failing IPAM DEL does not keep the device from going home; the runtime still sees its
// error (the IPAM plugin's first) and calls DEL again.
func del(args *skel.CmdArgs, n *Network) error {
	var ipamErr error
	if n.IPAM.Type != "" {
		ipamErr = ipam(invoke.DelegateDel, n.IPAM.Type, args.StdinData)
	}
	owner := attachmentOwner(n.Name, args.ContainerID, args.IfName)
	err := withRdmad(n, func(r *rdmad) error {
		mine, err := owned(r, owner)
		for _, c := range mine {
			if _, err := r.release(c.ID); err != nil {
				return err
			}
		}
		return err
	})
	if ipamErr != nil {
		return ipamErr
	}
	return err
}
