package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

// The plugin's input, decoded and checked before anything is touched (error 7). skel has
// checked the environment (error 4), the JSON (6), the name (7) and the version (1).

var (
	validPCI     = regexp.MustCompile(`^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$`)
	chardevKinds = []string{"uverbs", "rdma_cm", "umad", "issm"}
)

const (
	ownerPrefix   = "cni"
	ownerMaxBytes = 256 // rdmad's limit on a claim's owner
)

// Network is what every verb reads of the configuration; DEL, GC and STATUS read no more:
// a config ADD refused must not fail the DEL that follows it (a runtime retries a failed
// DEL: in Kubernetes the pod would never go).
type Network struct {
	types.NetConf
	BusAddress string `json:"busAddress,omitempty"`
	// Pod: attach what rdmad holds for the pod (K8S_POD_UID): pod.go
	Pod bool `json:"pod,omitempty"`
	// GC's valid attachments under the key the published 1.1.0 spec text named (corrected
	// later; libcni since 1.2.3 sends both): read as "none valid", every claim would go.
	Attachments []types.GCAttachment `json:"cni.dev/attachments,omitempty"`
}

// NetConf is an attachment's configuration (ADD and CHECK).
type NetConf struct {
	Network
	Device         string    `json:"device,omitempty"`
	DeviceID       string    `json:"deviceID,omitempty"` // a PCI address (Multus injects it)
	Selector       *Selector `json:"selector,omitempty"`
	Shared         bool      `json:"shared,omitempty"`
	MTU            *int      `json:"mtu,omitempty"`
	Chardevs       []string  `json:"chardevs,omitempty"`
	Netdev         *bool     `json:"netdev,omitempty"`
	PolicyRouting  bool      `json:"policyRouting,omitempty"` // the IPAM routes in the claim's own table
	Limits                   // cgroup, hcaHandles, hcaObjects: cgroup.go
	DeviceInfoFile string    `json:"CNIDeviceInfoFile,omitempty"`
	RuntimeConfig  struct {
		DeviceID       string `json:"deviceID,omitempty"`
		DeviceInfoFile string `json:"CNIDeviceInfoFile,omitempty"`
		MAC            string `json:"mac,omitempty"`
	} `json:"runtimeConfig,omitempty"`
	prev *current.Result // prevResult, in the library's current shape
}

// Selector picks a device by its properties; PCIAddress is a prefix ("0000:3b:" matches
// every function on that bus).
type Selector struct {
	Driver     string `json:"driver,omitempty"`
	LinkLayer  string `json:"linkLayer,omitempty"`
	Netdev     string `json:"netdev,omitempty"`
	NumaNode   *int   `json:"numaNode,omitempty"`
	PCIAddress string `json:"pciAddress,omitempty"`
}

// UnmarshalJSON refuses a key it does not know: a selector misspelled would pick any device.
func (s *Selector) UnmarshalJSON(data []byte) error {
	type plain Selector
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode((*plain)(s)); err != nil {
		return fmt.Errorf("selector: %v", err)
	}
	if *s == (Selector{}) {
		return errors.New("selector must be a non-empty object")
	}
	return nil
}

// env is one run's arguments: skel's, and the Kubernetes ones of CNI_ARGS.
type env struct {
	*skel.CmdArgs
	K8S k8sArgs
}

type k8sArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE types.UnmarshallableString
	K8S_POD_NAME      types.UnmarshallableString
	K8S_POD_UID       types.UnmarshallableString
}

func newEnv(args *skel.CmdArgs) (*env, error) {
	e := &env{CmdArgs: args}
	if err := types.LoadArgs(args.Args, &e.K8S); err != nil {
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_ARGS: "+err.Error(), "")
	}
	return e, nil
}

func invalid(format string, a ...any) error {
	return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf(format, a...), "")
}

func decode(stdin []byte, into any) error {
	if err := json.Unmarshal(stdin, into); err != nil {
		return invalid("the network configuration does not decode: %v", err)
	}
	return nil
}

func loadNetwork(stdin []byte) (*Network, error) {
	n := &Network{}
	return n, decode(stdin, n)
}

// loadNetConf reads and checks an attachment's configuration.
func loadNetConf(stdin []byte) (*NetConf, error) {
	c := &NetConf{}
	if err := decode(stdin, c); err != nil {
		return nil, err
	}
	// runtimeConfig's deviceID and CNIDeviceInfoFile count where the top level has none
	// (Multus injects either).
	if c.DeviceID == "" {
		c.DeviceID = c.RuntimeConfig.DeviceID
	}
	if c.DeviceInfoFile == "" {
		c.DeviceInfoFile = c.RuntimeConfig.DeviceInfoFile
	}
	if err := version.ParsePrevResult(&c.NetConf); err != nil {
		return nil, invalid("prevResult: %v", err)
	}
	if c.PrevResult != nil {
		prev, err := current.NewResultFromResult(c.PrevResult)
		if err != nil {
			return nil, invalid("prevResult: %v", err)
		}
		c.prev = prev
	}
	if c.Pod {
		return c, c.checkPod()
	}
	return c, c.check()
}

// checkPod: in pod mode the device and its options are the hold's, made by rdmad-dra
// from the pod's ResourceClaim, so a config naming any of them is refused.
func (c *NetConf) checkPod() error {
	for _, f := range []struct {
		key string
		set bool
	}{
		{"device", c.Device != ""}, {"deviceID", c.DeviceID != ""}, {"selector", c.Selector != nil},
		{"shared", c.Shared}, {"mtu", c.MTU != nil}, {"chardevs", c.Chardevs != nil},
		{"netdev", c.Netdev != nil}, {"policyRouting", c.PolicyRouting}, {"mac", c.RuntimeConfig.MAC != ""},
		{"cgroup", c.Cgroup != ""}, {"hcaHandles", c.HcaHandles != nil}, {"hcaObjects", c.HcaObjects != nil},
	} {
		if f.set {
			return invalid("%s does not go with pod: the pod's ResourceClaim chose the device and its options", f.key)
		}
	}
	return nil
}

func (c *NetConf) check() error {
	var given []string
	for _, g := range []struct {
		key string
		set bool
	}{{"device", c.Device != ""}, {"deviceID", c.DeviceID != ""}, {"selector", c.Selector != nil}} {
		if g.set {
			given = append(given, g.key)
		}
	}
	if len(given) != 1 {
		msg := "exactly one of device, deviceID and selector must name the device"
		if len(given) > 0 {
			msg += " (got " + strings.Join(given, ", ") + ")"
		}
		return invalid("%s", msg)
	}
	if c.DeviceID != "" && !validPCI.MatchString(c.DeviceID) {
		return invalid("deviceID %q is not a PCI address", c.DeviceID)
	}
	if c.MTU != nil && (*c.MTU < 68 || *c.MTU > 65535) {
		return invalid("mtu %d is not in 68-65535", *c.MTU)
	}
	for _, kind := range c.Chardevs {
		if !contains(chardevKinds, kind) {
			return invalid("chardevs: %q is not one of %s", kind, strings.Join(chardevKinds, ", "))
		}
	}
	netdev := c.hasNetdev()
	switch {
	case c.PolicyRouting && !netdev:
		return invalid("policyRouting needs a netdev in the container (netdev=false)")
	case c.Shared && !netdev:
		return invalid("netdev=false applies to whole-device claims only")
	case c.IPAM.Type != "" && !netdev:
		return invalid("ipam needs a netdev in the container (netdev=false)")
	}
	if mac := c.RuntimeConfig.MAC; mac != "" {
		if !c.Shared {
			return invalid("the mac capability applies to shared claims only: a whole device keeps its own MAC")
		}
		if hw, err := net.ParseMAC(mac); err != nil || len(hw) != 6 {
			return invalid("mac %q is not an Ethernet address", mac)
		}
	}
	return c.Limits.check()
}

// hasNetdev: the claim puts the device's netdev in the container (the default).
func (c *NetConf) hasNetdev() bool { return c.Netdev == nil || *c.Netdev }

// attachmentOwner is the claim's owner label: the attachment it belongs to, as the spec
// identifies it. "/" separates the parts: none of the three may contain one.
func attachmentOwner(network, containerID, ifname string) string {
	return ownerPrefix + "/" + network + "/" + containerID + "/" + ifname
}

// parseOwner gives the attachment of a claim this plugin made.
func parseOwner(owner string) (network string, a types.GCAttachment, ok bool) {
	parts := strings.Split(owner, "/")
	if len(parts) != 4 || parts[0] != ownerPrefix {
		return "", types.GCAttachment{}, false
	}
	return parts[1], types.GCAttachment{ContainerID: parts[2], IfName: parts[3]}, true
}

func contains(list []string, item string) bool {
	for _, v := range list {
		if v == item {
			return true
		}
	}
	return false
}
