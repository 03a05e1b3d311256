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
	"syscall"

	"github.com/godbus/dbus"
	"github.com/vishvananda/netlink"
)

// ADD, DEL, CHECK, GC and STATUS: each a few rdmad calls around the IPAM plugin.
// rdmad is the only record: a claim's owner names its attachment (attachmentOwner), so
// DEL, CHECK and GC find it after a reboot, a daemon restart or a lost cache.

// A CDI device name (the CDI spec's rule, kept to what CDI 0.5.0 readers accept).
var cdiNamePattern = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9_.\-]*[A-Za-z0-9])?$`)

const deviceInfoVersion = "1.1.0"

func withRdmad(conf *netConf, fn func(*rdmad) error) error {
	r, err := connect(busAddress(conf.BusAddress))
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
	if pod := e.Args["K8S_POD_NAME"]; pod != "" {
		name = pod
		if ns := e.Args["K8S_POD_NAMESPACE"]; ns != "" {
			name = ns + "." + pod
		}
	}
	return validCdiName(name)
}

// cdiName is the extra CDI device name of one attachment: its pod's name, "." and IFNAME.
func cdiName(e *env) string {
	if pod := podCdiName(e); pod != "" {
		return validCdiName(pod + "." + e.Ifname)
	}
	return ""
}

func validCdiName(name string) string {
	if !cdiNamePattern.MatchString(name) || len(name) > 253 {
		return ""
	}
	return name
}

func add(e *env, conf *netConf, environ map[string]string) (map[string]any, error) {
	owner := attachmentOwner(conf.Name, e.ContainerID, e.Ifname)
	if len(owner) > ownerMaxBytes {
		return nil, newError(codeInvalidConfig, "network name and container id are too long for a claim's owner")
	}
	var result map[string]any
	err := withRdmad(conf, func(r *rdmad) error {
		mine, err := owned(r, owner)
		if err != nil {
			return err
		}
		if len(mine) > 0 {
			return newError(codeDeviceBusy,
				fmt.Sprintf("%s already has %s on network %s", e.ContainerID, e.Ifname, conf.Name))
		}
		devices := []string{conf.Device}
		if conf.Device == "" {
			if devices, err = candidates(r, conf); err != nil {
				return err
			}
		}
		var addresses map[string]any
		if conf.IPAMType != "" {
			if addresses, err = runIPAM("ADD", e, conf, environ); err != nil {
				// The spec's delegation procedure: a failed delegated ADD gets its DEL, for
				// whatever the IPAM plugin kept of it (or a result we could not read).
				_, _ = runIPAM("DEL", e, conf, environ)
				return err
			}
		}
		result, err = attach(r, devices, e, conf, owner, addresses)
		if err != nil && conf.IPAMType != "" {
			_, _ = runIPAM("DEL", e, conf, environ) // the lease goes with the failed ADD
		}
		return err
	})
	return result, err
}

// attach claims a device and completes the interface; a failure after the claim releases it.
func attach(r *rdmad, devices []string, e *env, conf *netConf, owner string, addresses map[string]any) (map[string]any, error) {
	claim, err := claimFirst(r, devices, e, conf, owner, addresses)
	if err != nil {
		return nil, err
	}
	link, err := complete(e, conf, claim, addresses)
	if err == nil && conf.DeviceInfoFile != "" {
		err = writeDeviceInfo(r, conf.DeviceInfoFile, claim)
	}
	if err != nil {
		_, _ = r.release(claim.ID)
		return nil, err
	}
	return buildResult(e, conf, link, addresses), nil
}

// candidates are the devices the config's deviceID or selector picks, best first: for a
// shared claim the one with the fewest claims.
func candidates(r *rdmad, conf *netConf) ([]string, error) {
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
			return nil, newError(codeNoSuchDevice, "no RDMA device at PCI address "+conf.DeviceID)
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
		return nil, newError(codeNoSuchDevice, "no RDMA device "+wanted)
	}
	if len(free) == 0 {
		return nil, newError(codeDeviceBusy, "every RDMA device "+wanted+" is in use")
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

func selected(d device, s *selector) bool {
	return (s.Driver == "" || d.Driver == s.Driver) &&
		(s.LinkLayer == "" || strings.EqualFold(d.LinkLayer, s.LinkLayer)) &&
		(s.Netdev == "" || d.Netdev == s.Netdev) &&
		(s.NumaNode == nil || d.NumaNode == *s.NumaNode) &&
		(s.PCIAddress == "" || strings.HasPrefix(strings.ToLower(d.PCIAddress), strings.ToLower(s.PCIAddress)))
}

// claimFirst claims the first device that is still free (another pod may take one meanwhile).
func claimFirst(r *rdmad, devices []string, e *env, conf *netConf, owner string, addresses map[string]any) (claimRow, error) {
	options := map[string]dbus.Variant{
		"owner":  dbus.MakeVariant(owner),
		"shared": dbus.MakeVariant(conf.Shared),
	}
	if conf.Netdev {
		options["ifname"] = dbus.MakeVariant(e.Ifname)
	} else {
		options["netdev"] = dbus.MakeVariant(false)
	}
	if conf.MTU != nil {
		options["mtu"] = dbus.MakeVariant(*conf.MTU)
	}
	if len(conf.Chardevs) > 0 {
		options["chardevs"] = dbus.MakeVariant(conf.Chardevs)
	}
	if ips := listOf(addresses["ips"]); len(ips) > 0 {
		cidrs := []string{}
		for _, ip := range ips {
			address, _ := copyObject(ip)["address"].(string)
			cidrs = append(cidrs, address)
		}
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
		var cerr *cniError
		if !errors.As(err, &cerr) || cerr.Code != codeDeviceBusy {
			return claimRow{}, err
		}
	}
	return claimRow{}, err
}

// complete does what rdmad does not do in the netns: the MAC asked for, the IPAM routes.
func complete(e *env, conf *netConf, claim claimRow, addresses map[string]any) (netlink.Link, error) {
	if !conf.Netdev {
		return nil, nil
	}
	links, err := openNetns(e.Netns)
	if err != nil {
		return nil, newError(codeIOFailure, "cannot enter netns "+e.Netns, err.Error())
	}
	defer links.close()
	failed := func(err error) error {
		return newError(codeIOFailure, fmt.Sprintf("cannot configure %s in %s", claim.Ifname, e.Netns), err.Error())
	}
	link, err := links.link(claim.Ifname)
	if err != nil {
		return nil, failed(err)
	}
	if conf.MAC != "" {
		if err := links.setMAC(link, conf.MAC); err != nil {
			return nil, failed(err)
		}
		if link, err = links.link(claim.Ifname); err != nil {
			return nil, failed(err)
		}
	}
	if conf.PolicyRouting {
		return link, nil // the IPAM routes are in the claim's table (claimFirst)
	}
	for _, item := range listOf(addresses["routes"]) {
		route := copyObject(item)
		dst, _ := route["dst"].(string)
		gateway, _ := route["gw"].(string)
		if gateway == "" {
			gateway = gatewayFor(dst, addresses)
		}
		if err := links.addRoute(route, gateway, link); err != nil {
			return nil, failed(err)
		}
	}
	return link, nil
}

// tableRoutes are the IPAM result's routes as rdmad's routes option takes them,
// DST[,via=GW], each through its own gateway or else the one IPAM gave its family.
func tableRoutes(addresses map[string]any) []string {
	out := []string{}
	for _, item := range listOf(addresses["routes"]) {
		route := copyObject(item)
		dst, _ := route["dst"].(string)
		gateway, _ := route["gw"].(string)
		if gateway == "" {
			gateway = gatewayFor(dst, addresses)
		}
		if gateway != "" {
			dst += ",via=" + gateway
		}
		out = append(out, dst)
	}
	return out
}

// gatewayFor: a route without "gw" goes through the gateway IPAM gave the same family, as
// the reference plugins' ipam.ConfigureIface does; through the link when there is none.
func gatewayFor(dst string, addresses map[string]any) string {
	dstIP, _, err := net.ParseCIDR(dst)
	if err != nil {
		return ""
	}
	for _, item := range listOf(addresses["ips"]) {
		gw, _ := copyObject(item)["gateway"].(string)
		if ip := net.ParseIP(gw); ip != nil && (ip.To4() == nil) == (dstIP.To4() == nil) {
			return gw
		}
	}
	return ""
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
		return newError(codeIOFailure, "cannot write CNIDeviceInfoFile "+path, err.Error())
	}
	if err := os.WriteFile(path, info, 0o644); err != nil {
		return newError(codeIOFailure, "cannot write CNIDeviceInfoFile "+path, err.Error())
	}
	return nil
}

// buildResult is our interface and IPAM's addresses after the previous plugins' (chaining).
func buildResult(e *env, conf *netConf, link netlink.Link, addresses map[string]any) map[string]any {
	prev := conf.PrevResult
	interfaces := append([]any{}, listOf(prev["interfaces"])...)
	ips := append([]any{}, listOf(prev["ips"])...)
	routes := append([]any{}, listOf(prev["routes"])...)
	if link != nil {
		attrs := link.Attrs()
		interfaces = append(interfaces, map[string]any{
			"name": attrs.Name, "mac": attrs.HardwareAddr.String(), "mtu": attrs.MTU, "sandbox": e.Netns,
		})
		index := len(interfaces) - 1
		for _, item := range listOf(addresses["ips"]) {
			ip := copyObject(item)
			delete(ip, "version")
			ip["interface"] = index
			ips = append(ips, ip)
		}
		routes = append(routes, listOf(addresses["routes"])...)
	}
	result := map[string]any{"interfaces": interfaces, "ips": ips, "routes": routes}
	if dns := addresses["dns"]; dns != nil && len(copyObject(dns)) > 0 {
		result["dns"] = dns
	} else if dns := prev["dns"]; dns != nil && len(copyObject(dns)) > 0 {
		result["dns"] = dns
	}
	return result
}

// del is idempotent: no claim (never made, released, netns gone) is success. rdmad out of
// reach is not: the runtime sees "try again later". It is best effort, as the spec asks: a
// failing IPAM DEL does not keep the device from going home; the runtime still sees its
// error (the IPAM plugin's first) and calls DEL again.
func del(e *env, conf *netConf, environ map[string]string) error {
	var ipamErr error
	if conf.IPAMType != "" {
		_, ipamErr = runIPAM("DEL", e, conf, environ)
	}
	owner := attachmentOwner(conf.Name, e.ContainerID, e.Ifname)
	err := withRdmad(conf, func(r *rdmad) error {
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

func check(e *env, conf *netConf, environ map[string]string) error {
	owner := attachmentOwner(conf.Name, e.ContainerID, e.Ifname)
	var mine []claimRow
	err := withRdmad(conf, func(r *rdmad) (err error) {
		mine, err = owned(r, owner)
		return err
	})
	if err != nil {
		return err
	}
	if len(mine) == 0 {
		return newError(codeCheckFailed, fmt.Sprintf("no rdmad claim for %s of %s", e.Ifname, e.ContainerID))
	}
	var st syscall.Stat_t
	if err := syscall.Stat(e.Netns, &st); err != nil {
		return newError(codeCheckFailed, fmt.Sprintf("netns %s is gone", e.Netns), err.Error())
	}
	if mine[0].Netns != fmt.Sprintf("net:[%d]", st.Ino) {
		return newError(codeCheckFailed, fmt.Sprintf("claim %s is in %s, not %s", mine[0].ID, mine[0].Netns, e.Netns))
	}
	if conf.Netdev {
		if err := checkInterface(e, conf); err != nil {
			return err
		}
	}
	if conf.IPAMType != "" {
		_, err := runIPAM("CHECK", e, conf, environ)
		return err
	}
	return nil
}

func checkInterface(e *env, conf *netConf) error {
	links, err := openNetns(e.Netns)
	if err != nil {
		return newError(codeCheckFailed, fmt.Sprintf("netns %s is gone", e.Netns), err.Error())
	}
	defer links.close()
	link, err := links.link(e.Ifname)
	if err != nil {
		return newError(codeCheckFailed, fmt.Sprintf("interface %s is gone from %s", e.Ifname, e.Netns))
	}
	have, err := links.addresses(link)
	if err != nil {
		return newError(codeIOFailure, "cannot read the addresses of "+e.Ifname, err.Error())
	}
	mac := link.Attrs().HardwareAddr.String()
	ours := map[int]bool{}
	for i, item := range listOf(conf.PrevResult["interfaces"]) {
		iface := copyObject(item)
		if iface["name"] != e.Ifname || iface["sandbox"] == nil || iface["sandbox"] == "" {
			continue
		}
		ours[i] = true
		if want, _ := iface["mac"].(string); want != "" && !strings.EqualFold(want, mac) {
			return newError(codeCheckFailed, fmt.Sprintf("%s has MAC %s, not %s", e.Ifname, mac, want))
		}
	}
	for _, item := range listOf(conf.PrevResult["ips"]) {
		ip := copyObject(item)
		index, isIndex := integer(ip["interface"])
		if !isIndex || !ours[int(index)] {
			continue
		}
		address, _ := ip["address"].(string)
		addr, network, err := net.ParseCIDR(address)
		if err != nil {
			return newError(codeInvalidConfig, fmt.Sprintf("prevResult: %q is not an address", address))
		}
		ones, _ := network.Mask.Size()
		want := fmt.Sprintf("%s/%d", addr, ones)
		if !have[want] {
			return newError(codeCheckFailed, fmt.Sprintf("%s lost its address %s", e.Ifname, want))
		}
	}
	return nil
}

// gc releases this network's claims whose attachment the runtime no longer lists, and
// frees each one's IPAM lease with the IPAM plugin's DEL for that attachment (Debian's
// IPAM plugins have no GC verb); then it forwards GC to the IPAM plugin, as the spec asks,
// where the config's version has GC (1.1.0). A failure does not stop it: it removes what
// it can and reports every failure.
func gc(e *env, conf *netConf, environ map[string]string) error {
	valid := map[attachment]bool{}
	for _, a := range conf.ValidAttachments {
		valid[a] = true
	}
	var errs []error
	err := withRdmad(conf, func(r *rdmad) error {
		rows, err := r.claims()
		if err != nil {
			return err
		}
		for _, c := range rows {
			network, container, ifname, ok := parseOwner(c.Owner)
			if !ok || network != conf.Name || valid[attachment{container, ifname}] || valid[attachment{container, ""}] {
				continue
			}
			if _, err := r.release(c.ID); err != nil {
				errs = append(errs, err) // its lease stays with it, for the next GC
				continue
			}
			if conf.IPAMType != "" {
				its := map[string]string{}
				for k, v := range environ {
					its[k] = v
				}
				its["CNI_CONTAINERID"], its["CNI_IFNAME"], its["CNI_NETNS"] = container, ifname, ""
				if _, err := runIPAM("DEL", e, conf, its); err != nil {
					errs = append(errs, err)
				}
			}
		}
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	if conf.IPAMType != "" && atLeast(conf.Version, "1.1.0") {
		if _, err := runIPAM("GC", e, conf, environ); err != nil {
			errs = append(errs, err)
		}
	}
	return firstOf(errs)
}

// status: rdmad answers, and then, as the spec asks of a plugin that delegates, the IPAM
// plugin's STATUS where the config's version has it (1.1.0).
func status(e *env, conf *netConf, environ map[string]string) error {
	err := withRdmad(conf, func(r *rdmad) error {
		_, err := r.version()
		return err
	})
	var cerr *cniError
	if errors.As(err, &cerr) && cerr.Code == codeTryAgainLater {
		details := cerr.Details
		if details == "" {
			details = cerr.Msg
		}
		return newError(codeNotAvailable, "rdmad is not available", details)
	}
	if err == nil && conf.IPAMType != "" && atLeast(conf.Version, "1.1.0") {
		_, err = runIPAM("STATUS", e, conf, environ)
	}
	return err
}
