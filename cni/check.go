package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// CHECK, GC and STATUS: the runtime asking after the attachments it made, and after the
// plugin itself.

// Codes of the spec's (1.1.0) that the library does not name, and the plugin's own.
const (
	codeNotAvailable uint = 50  // STATUS: the plugin cannot serve ADDs now
	codeCheckFailed  uint = 120 // CHECK found the attachment incomplete
)

func cmdCheck(args *skel.CmdArgs) error {
	conf, err := loadNetConf(args.StdinData)
	if err != nil || conf.Pod {
		return err // pod mode: the attached claims are the pod's netns's; rdmad ends them with it
	}
	return check(args, conf)
}

func check(args *skel.CmdArgs, conf *NetConf) error {
	owner := attachmentOwner(conf.Name, args.ContainerID, args.IfName)
	var mine []claimRow
	err := withRdmad(&conf.Network, func(r *rdmad) (err error) {
		mine, err = owned(r, owner)
		return err
	})
	if err != nil {
		return err
	}
	if len(mine) == 0 {
		return types.NewError(codeCheckFailed, fmt.Sprintf("no rdmad claim for %s of %s", args.IfName, args.ContainerID), "")
	}
	if netns, err := netnsID(args.Netns); err != nil {
		return types.NewError(codeCheckFailed, fmt.Sprintf("netns %s is gone", args.Netns), err.Error())
	} else if mine[0].Netns != netns {
		return types.NewError(codeCheckFailed, fmt.Sprintf("claim %s is in %s, not %s", mine[0].ID, mine[0].Netns, args.Netns), "")
	}
	if conf.hasNetdev() {
		if err := checkInterface(args, conf.prev); err != nil {
			return err
		}
	}
	if conf.IPAM.Type != "" {
		return ipam(invoke.DelegateCheck, conf.IPAM.Type, args.StdinData)
	}
	return nil
}

// checkInterface: the interface is there with the MAC and addresses prevResult gives it.
func checkInterface(args *skel.CmdArgs, prev *current.Result) error {
	links, err := openNetns(args.Netns)
	if err != nil {
		return types.NewError(codeCheckFailed, fmt.Sprintf("netns %s is gone", args.Netns), err.Error())
	}
	defer links.close()
	link, err := links.link(args.IfName)
	if err != nil {
		return types.NewError(codeCheckFailed, fmt.Sprintf("interface %s is gone from %s", args.IfName, args.Netns), "")
	}
	have, err := links.addresses(link)
	if err != nil {
		return types.NewError(types.ErrIOFailure, "cannot read the addresses of "+args.IfName, err.Error())
	}
	if prev == nil {
		return nil
	}
	mac := link.Attrs().HardwareAddr.String()
	ours := map[int]bool{}
	for i, iface := range prev.Interfaces {
		if iface.Name != args.IfName || iface.Sandbox == "" {
			continue
		}
		ours[i] = true
		if iface.Mac != "" && !strings.EqualFold(iface.Mac, mac) {
			return types.NewError(codeCheckFailed, fmt.Sprintf("%s has MAC %s, not %s", args.IfName, mac, iface.Mac), "")
		}
	}
	for _, ip := range prev.IPs {
		if ip.Interface == nil || !ours[*ip.Interface] {
			continue
		}
		if want := ip.Address.String(); !have[want] {
			return types.NewError(codeCheckFailed, fmt.Sprintf("%s lost its address %s", args.IfName, want), "")
		}
	}
	return nil
}

// cmdGC releases this network's claims whose attachment the runtime no longer lists, and
// frees each one's IPAM lease with the IPAM plugin's DEL for that attachment (Debian's
// IPAM plugins have no GC verb); then it forwards GC to the IPAM plugin, as the spec asks.
// A failure does not stop it: it removes what it can and reports every failure.
func cmdGC(args *skel.CmdArgs) error {
	n, err := loadNetwork(args.StdinData)
	if err != nil {
		return err
	}
	valid := map[types.GCAttachment]bool{}
	for _, a := range append(n.ValidAttachments, n.Attachments...) {
		valid[a] = true
	}
	var errs []error
	err = withRdmad(n, func(r *rdmad) error {
		rows, err := r.claims()
		if err != nil {
			return err
		}
		for _, c := range rows {
			network, a, ok := parseOwner(c.Owner)
			if !ok || network != n.Name || valid[a] || valid[types.GCAttachment{ContainerID: a.ContainerID}] {
				continue
			}
			if _, err := r.release(c.ID); err != nil {
				errs = append(errs, err) // its lease stays with it, for the next GC
			} else if n.IPAM.Type != "" {
				errs = append(errs, ipamDelFor(n.IPAM.Type, args, a))
			}
		}
		return nil
	})
	errs = append(errs, err)
	if n.IPAM.Type != "" {
		errs = append(errs, ipam(invoke.DelegateGC, n.IPAM.Type, args.StdinData))
	}
	return firstOf(errs)
}

// firstOf is the first of several failures, with its code; the others are named in its
// details. nil when there are none (nil entries are no failure).
func firstOf(errs []error) error {
	var first *types.Error
	var also []string
	for _, err := range errs {
		switch {
		case err == nil:
		case first != nil:
			also = append(also, "also: "+err.Error())
		case !errors.As(err, &first):
			first = types.NewError(codeRdmadFailed, err.Error(), "")
		}
	}
	if first == nil {
		return nil
	}
	if len(also) == 0 {
		return first
	}
	details := append([]string{first.Details}, also...)
	if first.Details == "" {
		details = also
	}
	return types.NewError(first.Code, first.Msg, strings.Join(details, "; "))
}

// cmdStatus: rdmad answers, and then, as the spec asks of a plugin that delegates, the IPAM
// plugin's STATUS.
func cmdStatus(args *skel.CmdArgs) error {
	n, err := loadNetwork(args.StdinData)
	if err != nil {
		return err
	}
	err = withRdmad(n, func(r *rdmad) error {
		_, err := r.version()
		return err
	})
	var cerr *types.Error
	if errors.As(err, &cerr) && cerr.Code == types.ErrTryAgainLater {
		details := cerr.Details
		if details == "" {
			details = cerr.Msg
		}
		return types.NewError(codeNotAvailable, "rdmad is not available", details)
	}
	if err == nil && n.IPAM.Type != "" {
		err = ipam(invoke.DelegateStatus, n.IPAM.Type, args.StdinData)
	}
	return err
}
