package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// The plugin's input: the network configuration, CNI_ARGS and the attachment as an owner
// label. Every verb is specified end to end by tests/cni (the binary run as a runtime runs it).

// conf is a 1.0.0 network configuration with the given keys (JSON members) added.
func conf(members string) []byte {
	doc := `{"cniVersion": "1.0.0", "name": "n", "type": "rdmad"`
	if members != "" {
		doc += ", " + members
	}
	return []byte(doc + "}")
}

// codeOf is the error document's code of err, 0 for none.
func codeOf(t *testing.T, err error) uint {
	t.Helper()
	if err == nil {
		return 0
	}
	var e *types.Error
	if !errors.As(err, &e) {
		t.Fatalf("not an error document: %v", err)
	}
	return e.Code
}

func TestLoadNetConfRefusesWhatNamesNoDeviceOrAnInvalidOne(t *testing.T) {
	for _, tc := range []struct {
		name    string
		members string
		msg     string // the start of the error's msg
	}{
		{"no device", `"shared": true`, "exactly one of device, deviceID and selector"},
		{"two ways to it", `"device": "d", "selector": {"driver": "x"}`, "exactly one of device, deviceID and selector must name the device (got device, selector)"},
		{"deviceID not PCI", `"deviceID": "3b:00.2"`, `deviceID "3b:00.2" is not a PCI address`},
		{"a key of the wrong type", `"device": "d", "shared": "yes"`, "the network configuration does not decode"},
		{"mtu with a fraction", `"device": "d", "mtu": 1500.5`, "the network configuration does not decode"},
		{"mtu too small", `"device": "d", "mtu": 10`, "mtu 10 is not in 68-65535"},
		{"mtu too large", `"device": "d", "mtu": 65536`, "mtu 65536 is not in 68-65535"},
		{"unknown chardev", `"device": "d", "chardevs": ["uverbs", "gpu"]`, `chardevs: "gpu" is not one of`},
		{"unknown selector key", `"selector": {"colour": "red"}`, "the network configuration does not decode"},
		{"empty selector", `"selector": {}`, "the network configuration does not decode"},
		{"numaNode not an integer", `"selector": {"numaNode": "0"}`, "the network configuration does not decode"},
		{"policyRouting not a boolean", `"device": "d", "policyRouting": "auto"`, "the network configuration does not decode"},
		{"policyRouting without a netdev", `"device": "d", "netdev": false, "policyRouting": true`, "policyRouting needs a netdev"},
		{"shared without a netdev", `"device": "d", "netdev": false, "shared": true`, "netdev=false applies to whole-device claims only"},
		{"ipam without a netdev", `"device": "d", "netdev": false, "ipam": {"type": "host-local"}`, "ipam needs a netdev"},
		{"mac on a whole device", `"device": "d", "runtimeConfig": {"mac": "02:00:00:00:00:01"}`, "the mac capability applies to shared claims only"},
		{"mac not Ethernet", `"device": "d", "shared": true, "runtimeConfig": {"mac": "02:00:zz:00:00:01"}`, `mac "02:00:zz:00:00:01" is not an Ethernet address`},
		{"pod naming the device", `"pod": true, "device": "d"`, "device does not go with pod"},
		{"pod with deviceID from runtimeConfig", `"pod": true, "runtimeConfig": {"deviceID": "0000:3b:00.2"}`, "deviceID does not go with pod"},
		{"pod with a mac", `"pod": true, "runtimeConfig": {"mac": "02:00:00:00:00:01"}`, "mac does not go with pod"},
		{"pod with netdev", `"pod": true, "netdev": true`, "netdev does not go with pod"},
		{"prevResult not a result", `"device": "d", "prevResult": {"ips": "none"}`, "prevResult:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadNetConf(conf(tc.members))
			if codeOf(t, err) != types.ErrInvalidNetworkConfig || !strings.HasPrefix(err.(*types.Error).Msg, tc.msg) {
				t.Fatalf("got %v, want error 7 %q", err, tc.msg)
			}
		})
	}
}

func TestLoadNetConfReadsTheDeviceAndItsOptions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		members string
		check   func(*NetConf) bool
	}{
		{"device by name", `"device": "mlx5_0"`, func(c *NetConf) bool { return c.Device == "mlx5_0" && c.hasNetdev() }},
		{"top-level deviceID wins over runtimeConfig's", `"deviceID": "0000:3b:00.2", "runtimeConfig": {"deviceID": "0000:3b:00.3"}`,
			func(c *NetConf) bool { return c.DeviceID == "0000:3b:00.2" }},
		{"runtimeConfig's deviceID alone", `"runtimeConfig": {"deviceID": "0000:3b:00.3"}`,
			func(c *NetConf) bool { return c.DeviceID == "0000:3b:00.3" }},
		{"runtimeConfig's CNIDeviceInfoFile", `"device": "d", "runtimeConfig": {"CNIDeviceInfoFile": "/x"}`,
			func(c *NetConf) bool { return c.DeviceInfoFile == "/x" }},
		{"selector", `"selector": {"driver": "mlx5_core", "numaNode": 1, "pciAddress": "0000:3b:"}`,
			func(c *NetConf) bool {
				return c.Selector.Driver == "mlx5_core" && *c.Selector.NumaNode == 1 && c.Selector.PCIAddress == "0000:3b:"
			}},
		{"netdev off", `"device": "d", "netdev": false`, func(c *NetConf) bool { return !c.hasNetdev() }},
		{"policyRouting off unless asked", `"device": "d"`, func(c *NetConf) bool { return !c.PolicyRouting }},
		{"policyRouting", `"device": "d", "policyRouting": true`, func(c *NetConf) bool { return c.PolicyRouting }},
		{"mtu and chardevs", `"device": "d", "mtu": 9000, "chardevs": ["uverbs", "rdma_cm"]`,
			func(c *NetConf) bool { return *c.MTU == 9000 && len(c.Chardevs) == 2 }},
		{"a shared claim's mac", `"device": "d", "shared": true, "runtimeConfig": {"mac": "02:00:00:aa:bb:cc"}`,
			func(c *NetConf) bool { return c.RuntimeConfig.MAC == "02:00:00:aa:bb:cc" }},
		{"limits", `"device": "d", "cgroup": "rdma.slice", "hcaHandles": 2, "hcaObjects": 0`,
			func(c *NetConf) bool { return c.Cgroup == "rdma.slice" && *c.HcaHandles == 2 && *c.HcaObjects == 0 }},
		{"pod mode", `"pod": true, "ipam": {"type": "host-local"}`, func(c *NetConf) bool { return c.Pod && c.IPAM.Type == "host-local" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadNetConf(conf(tc.members))
			if err != nil || !tc.check(c) {
				t.Fatalf("got %+v, %v", c, err)
			}
		})
	}
}

func TestA040PrevResultIsReadInTheCurrentShape(t *testing.T) {
	c, err := loadNetConf([]byte(`{"cniVersion": "0.4.0", "name": "n", "device": "d", "prevResult": {
		"cniVersion": "0.4.0", "interfaces": [{"name": "eth0"}],
		"ips": [{"version": "4", "address": "10.5.0.9/24", "interface": 0}]}}`))
	if err != nil || c.prev.CNIVersion != current.ImplementedSpecVersion || c.prev.IPs[0].Address.String() != "10.5.0.9/24" {
		t.Fatalf("got %+v, %v", c, err)
	}
}

func TestDelGCAndStatusReadNoMoreThanTheyUseOfAConfigAddRefuses(t *testing.T) {
	n, err := loadNetwork(conf(`"device": "d", "selector": {"colour": "red"}, "mtu": 10.5,
		"shared": true, "netdev": false, "busAddress": "unix:path=/x", "ipam": {"type": "host-local"}`))
	if err != nil || n.BusAddress != "unix:path=/x" || n.IPAM.Type != "host-local" {
		t.Fatalf("got %+v, %v", n, err)
	}
}

func TestGCReadsBothKeysOfTheValidAttachments(t *testing.T) {
	n, err := loadNetwork([]byte(`{"cniVersion": "1.1.0", "name": "n",
		"cni.dev/valid-attachments": [{"containerID": "a", "ifname": "net1"}],
		"cni.dev/attachments": [{"containerID": "b", "ifname": "net2"}]}`))
	if err != nil || n.ValidAttachments[0].ContainerID != "a" || n.Attachments[0].IfName != "net2" {
		t.Fatalf("got %+v, %v", n, err)
	}
}

func TestCniArgs(t *testing.T) {
	for _, tc := range []struct {
		name, args string
		code       uint
		podName    string
	}{
		{"none", "", 0, ""},
		{"the pod's", "IgnoreUnknown=1;K8S_POD_NAMESPACE=ml;K8S_POD_NAME=web;K8S_POD_UID=u1", 0, "web"},
		{"unknown ones ignored when asked", "IgnoreUnknown=1;K8S_POD_INFRA_CONTAINER_ID=x;K8S_POD_NAME=web", 0, "web"},
		{"unknown ones refused otherwise", "K8S_POD_INFRA_CONTAINER_ID=x", types.ErrInvalidEnvironmentVariables, ""},
		{"a pair without =", "nonsense", types.ErrInvalidEnvironmentVariables, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := newEnv(&skel.CmdArgs{ContainerID: "c1", IfName: "net1", Args: tc.args})
			if codeOf(t, err) != tc.code || (err == nil && string(e.K8S.K8S_POD_NAME) != tc.podName) {
				t.Fatalf("got %+v, %v", e, err)
			}
		})
	}
}

func TestOwnerRoundTripsTheAttachment(t *testing.T) {
	network, a, ok := parseOwner(attachmentOwner("rdma0", "abc123", "eth0"))
	if !ok || network != "rdma0" || a != (types.GCAttachment{ContainerID: "abc123", IfName: "eth0"}) {
		t.Fatalf("got %q %+v %v", network, a, ok)
	}
}

func TestOwnersNotMadeByThePluginAreNotAttachments(t *testing.T) {
	for _, owner := range []string{"", "ctr", "cni/a/b", "other/a/b/c", "cni/a/b/c/d", "dra/claim-uid"} {
		t.Run(owner, func(t *testing.T) {
			if _, _, ok := parseOwner(owner); ok {
				t.Errorf("%q parsed as an attachment", owner)
			}
		})
	}
}

func TestCdiNames(t *testing.T) {
	for _, tc := range []struct {
		name, args    string
		pod, attached string
	}{
		{"namespace and pod name", "K8S_POD_NAMESPACE=ml;K8S_POD_NAME=trainer-0", "ml.trainer-0", "ml.trainer-0.net1"},
		{"pod name alone (podman's container name)", "K8S_POD_NAME=web", "web", "web.net1"},
		{"the container id without a pod", "", "abc", "abc.net1"},
		{"none when not a CDI name", "K8S_POD_NAME=-web", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := newEnv(&skel.CmdArgs{ContainerID: "abc", IfName: "net1", Args: tc.args})
			if err != nil {
				t.Fatal(err)
			}
			if pod, attached := podCdiName(e), cdiName(e); pod != tc.pod || attached != tc.attached {
				t.Fatalf("got %q, %q", pod, attached)
			}
		})
	}
}
