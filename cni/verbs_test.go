package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// The verbs' parts that need no rdmad: the result they build, the routes they hand rdmad,
// how failures are reported.

func cidr(t *testing.T, text string) net.IPNet {
	t.Helper()
	ip, network, err := net.ParseCIDR(text)
	if err != nil {
		t.Fatal(err)
	}
	return net.IPNet{IP: ip, Mask: network.Mask}
}

// lease is an IPAM result: addresses "ADDRESS/PREFIX[,via=GATEWAY]" and routes "DST[,via=GW]".
func lease(t *testing.T, ips []string, routes ...string) *current.Result {
	t.Helper()
	r := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	for _, text := range ips {
		address, gw, _ := strings.Cut(text, ",via=")
		r.IPs = append(r.IPs, &current.IPConfig{Address: cidr(t, address), Gateway: net.ParseIP(gw)})
	}
	for _, text := range routes {
		dst, gw, _ := strings.Cut(text, ",via=")
		r.Routes = append(r.Routes, &types.Route{Dst: cidr(t, dst), GW: net.ParseIP(gw)})
	}
	return r
}

// shaped is result as the runtime reads it for version: a JSON object.
func shaped(t *testing.T, result *current.Result, version string) map[string]any {
	t.Helper()
	converted, err := result.GetAsVersion(version)
	if err != nil {
		t.Fatal(err)
	}
	text, err := json.Marshal(converted)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(text, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestTheResultHasTheShapeOfTheRequestedVersion(t *testing.T) {
	result := chained(nil)
	result.Interfaces = append(result.Interfaces, &current.Interface{Name: "net1", Mtu: 1500, Sandbox: "/run/netns/x"})
	withAddresses(result, lease(t, []string{"10.0.0.2/24", "fd00::2/64"}))
	for _, tc := range []struct {
		version  string
		versions []any // each IP's "version" (0.3.x and 0.4.0 only)
		mtu      bool  // an interface's mtu (1.0.0 and later)
	}{
		{"0.3.0", []any{"4", "6"}, false},
		{"0.3.1", []any{"4", "6"}, false},
		{"0.4.0", []any{"4", "6"}, false},
		{"1.0.0", []any{nil, nil}, true},
		{"1.1.0", []any{nil, nil}, true},
	} {
		t.Run(tc.version, func(t *testing.T) {
			out := shaped(t, result, tc.version)
			var versions []any
			for _, ip := range out["ips"].([]any) {
				versions = append(versions, ip.(map[string]any)["version"])
			}
			_, hasMtu := out["interfaces"].([]any)[0].(map[string]any)["mtu"]
			if out["cniVersion"] != tc.version || !reflect.DeepEqual(versions, tc.versions) || hasMtu != tc.mtu {
				t.Fatalf("got %v", out)
			}
		})
	}
}

func TestAChainedResultAppendsItsInterfaceAndAddressesAfterThePreviousPlugins(t *testing.T) {
	prev := lease(t, []string{"10.5.0.9/24"}, "0.0.0.0/0,via=10.5.0.1")
	prev.Interfaces = []*current.Interface{{Name: "eth0", Sandbox: "/run/netns/x"}}
	prev.IPs[0].Interface = current.Int(0)
	result := chained(prev)
	result.Interfaces = append(result.Interfaces, &current.Interface{Name: "net1", Sandbox: "/run/netns/x"})
	withAddresses(result, lease(t, []string{"10.77.0.2/24"}, "10.78.0.0/16"))
	var got []string
	for _, ip := range result.IPs {
		got = append(got, fmt.Sprintf("%s@%d", ip.Address.String(), *ip.Interface))
	}
	if want := []string{"10.5.0.9/24@0", "10.77.0.2/24@1"}; !reflect.DeepEqual(got, want) || len(result.Routes) != 2 {
		t.Fatalf("got %v, %v", got, result.Routes)
	}
	if prev.IPs[0].Interface == nil || len(prev.Interfaces) != 1 {
		t.Fatalf("prevResult changed: %v", prev)
	}
}

func TestIPAMsDNSReplacesThePreviousPluginsOnlyWhenItSaysAnything(t *testing.T) {
	for _, tc := range []struct {
		name       string
		prev, ipam []string
		want       []string
	}{
		{"IPAM's", []string{"10.0.0.53"}, []string{"10.1.0.53"}, []string{"10.1.0.53"}},
		{"the previous plugins' when IPAM has none", []string{"10.0.0.53"}, nil, []string{"10.0.0.53"}},
		{"none", nil, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prev, addresses := lease(t, nil), lease(t, nil)
			prev.DNS.Nameservers, addresses.DNS.Nameservers = tc.prev, tc.ipam
			result := chained(prev)
			result.Interfaces = []*current.Interface{{Name: "net1"}}
			withAddresses(result, addresses)
			if !reflect.DeepEqual(result.DNS.Nameservers, tc.want) {
				t.Fatalf("got %v", result.DNS)
			}
		})
	}
}

func TestTableRoutesGoThroughTheirGatewayOrTheFamilysOwn(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ips    []string
		routes []string
		want   []string
	}{
		{"the family's gateway", []string{"10.1.0.5/24,via=10.1.0.1"}, []string{"0.0.0.0/0"}, []string{"0.0.0.0/0,via=10.1.0.1"}},
		{"the route's own gateway", []string{"10.1.0.5/24,via=10.1.0.1"}, []string{"10.9.0.0/16,via=10.1.0.254"}, []string{"10.9.0.0/16,via=10.1.0.254"}},
		{"through the link when its family has none", []string{"10.1.0.5/24,via=10.1.0.1", "fd00::5/64"}, []string{"fd99::/64"}, []string{"fd99::/64"}},
		{"no routes", []string{"10.1.0.5/24"}, nil, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tableRoutes(lease(t, tc.ips, tc.routes...)); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %q", got)
			}
		})
	}
}

func TestFirstOfSeveralFailuresKeepsItsCodeAndNamesTheOthers(t *testing.T) {
	for _, tc := range []struct {
		name string
		errs []error
		want *types.Error
	}{
		{"none", []error{nil, nil}, nil},
		{"one", []error{nil, types.NewError(11, "a", "why a")}, types.NewError(11, "a", "why a")},
		{"several", []error{types.NewError(11, "a", "why a"), nil, types.NewError(5, "b", "")},
			types.NewError(11, "a", "why a; also: b")},
		{"one that is no error document", []error{errors.New("c")}, types.NewError(codeRdmadFailed, "c", "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := firstOf(tc.errs)
			if tc.want == nil && got == nil {
				return
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %#v", got)
			}
		})
	}
}

func TestAnIPAMPluginsErrorKeepsItsCodeAndNamesIt(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want *types.Error
	}{
		{"its error document", types.NewError(11, "busy", "d"), types.NewError(11, "IPAM host-local: busy", "d")},
		{"a failure without one", &types.Error{Msg: "netplugin failed"}, types.NewError(types.ErrIOFailure, "IPAM host-local: netplugin failed", "")},
		{"not found", errors.New("failed to find plugin"), types.NewError(types.ErrInvalidNetworkConfig, "IPAM host-local: failed to find plugin", "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ipamError("host-local", tc.err); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %#v", got)
			}
		})
	}
	if ipamError("host-local", nil) != nil {
		t.Fatal("no error became one")
	}
}

func TestAPodAddWithoutAPodUIDPassesPrevResultOn(t *testing.T) {
	c, err := loadNetConf(conf(`"pod": true, "prevResult": {"cniVersion": "1.0.0",
		"interfaces": [{"name": "eth0", "sandbox": "/run/netns/x"}], "ips": [{"address": "10.5.0.9/24", "interface": 0}]}`))
	if err != nil {
		t.Fatal(err)
	}
	e, _ := newEnv(&skel.CmdArgs{ContainerID: "c1", IfName: "eth0", Args: "K8S_POD_NAME=web"})
	result, err := podAdd(e, c)
	if err != nil || len(result.Interfaces) != 1 || result.IPs[0].Address.String() != "10.5.0.9/24" {
		t.Fatalf("got %+v, %v", result, err)
	}
}

func TestAPodDelAfterTheNetnsWentTouchesNothing(t *testing.T) {
	n, _ := loadNetwork(conf(`"pod": true, "busAddress": "unix:path=/nonexistent"`))
	for _, netns := range []string{"", "/run/netns/gone"} {
		if err := podDel(&skel.CmdArgs{ContainerID: "c1", IfName: "eth0", Netns: netns}, n); err != nil {
			t.Fatalf("%q: %v", netns, err)
		}
	}
}

func TestVerbsRefuseAConfigThatDoesNotDecode(t *testing.T) {
	for name, verb := range map[string]func(*skel.CmdArgs) error{
		"ADD": cmdAdd, "DEL": cmdDel, "CHECK": cmdCheck, "GC": cmdGC, "STATUS": cmdStatus,
	} {
		t.Run(name, func(t *testing.T) {
			err := verb(&skel.CmdArgs{ContainerID: "c1", IfName: "net1", StdinData: conf(`"ipam": []`)})
			if codeOf(t, err) != types.ErrInvalidNetworkConfig {
				t.Fatalf("got %v", err)
			}
		})
	}
}

func TestRdmadOutOfReachIsTryAgainLaterAndForStatusNotAvailable(t *testing.T) {
	bus := `"device": "d", "busAddress": "unix:path=/nonexistent/bus"`
	for _, tc := range []struct {
		name string
		verb func(*skel.CmdArgs) error
		code uint
	}{
		{"ADD", cmdAdd, types.ErrTryAgainLater},
		{"DEL", cmdDel, types.ErrTryAgainLater},
		{"STATUS", cmdStatus, codeNotAvailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.verb(&skel.CmdArgs{ContainerID: "c1", IfName: "net1", Netns: "/run/netns/x", StdinData: conf(bus)})
			if codeOf(t, err) != tc.code {
				t.Fatalf("got %v", err)
			}
		})
	}
}
