package main

import (
	"reflect"
	"testing"
)

// The plugin's input: the attachment as an owner label, CNI_ARGS, result shapes. Every verb
// is specified end to end by tests/cni (the binary run as a runtime runs it).

var addEnv = map[string]string{
	"CNI_COMMAND":     "ADD",
	"CNI_CONTAINERID": "c1",
	"CNI_NETNS":       "/run/netns/x",
	"CNI_IFNAME":      "net1",
}

func envWith(extra map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range []map[string]string{addEnv, extra} {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

func codeOf(t *testing.T, err error) int {
	t.Helper()
	cerr, ok := err.(*cniError)
	if !ok {
		t.Fatalf("expected a CNI error, got %v", err)
	}
	return cerr.Code
}

func TestOwnerRoundTripsTheAttachment(t *testing.T) {
	network, container, ifname, ok := parseOwner(attachmentOwner("rdma0", "abc123", "eth0"))
	if !ok || network != "rdma0" || container != "abc123" || ifname != "eth0" {
		t.Fatalf("got %q %q %q %v", network, container, ifname, ok)
	}
}

func TestOwnersNotMadeByThePluginAreNotAttachments(t *testing.T) {
	for _, owner := range []string{"", "ctr", "cni/a/b", "other/a/b/c", "cni/a/b/c/d"} {
		if _, _, _, ok := parseOwner(owner); ok {
			t.Errorf("%q parsed as an attachment", owner)
		}
	}
}

func TestCniArgsAreKeyValuePairs(t *testing.T) {
	e, err := parseEnv(envWith(map[string]string{"CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAME=web"}))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"IgnoreUnknown": "1", "K8S_POD_NAME": "web"}
	if !reflect.DeepEqual(e.Args, want) {
		t.Fatalf("got %v", e.Args)
	}
}

func TestCniArgsWithoutEqualsIsError4(t *testing.T) {
	_, err := parseEnv(envWith(map[string]string{"CNI_ARGS": "nonsense"}))
	if codeOf(t, err) != codeInvalidEnv {
		t.Fatalf("got %v", err)
	}
}

func TestDelNeedsNoNetns(t *testing.T) {
	e, err := parseEnv(envWith(map[string]string{"CNI_COMMAND": "DEL", "CNI_NETNS": ""}))
	if err != nil || e.Netns != "" {
		t.Fatalf("got %v, %v", e, err)
	}
}

func TestTopLevelDeviceIDWinsOverRuntimeConfig(t *testing.T) {
	conf, err := parseNetconf([]byte(`{"cniVersion": "1.0.0", "name": "n", "deviceID": "0000:3b:00.2",
		"runtimeConfig": {"deviceID": "0000:3b:00.3"}}`), "ADD")
	if err != nil || conf.DeviceID != "0000:3b:00.2" {
		t.Fatalf("got %v, %v", conf, err)
	}
}

func TestAKeyOfTheWrongTypeIsError7(t *testing.T) {
	_, err := parseNetconf([]byte(`{"cniVersion": "1.0.0", "name": "n", "device": "d", "shared": "yes"}`), "ADD")
	if codeOf(t, err) != codeInvalidConfig || err.Error() != "shared must be a JSON boolean" {
		t.Fatalf("got %v", err)
	}
}

func TestAnMtuWithAFractionIsError7(t *testing.T) {
	_, err := parseNetconf([]byte(`{"cniVersion": "1.0.0", "name": "n", "device": "d", "mtu": 1500.5}`), "ADD")
	if codeOf(t, err) != codeInvalidConfig {
		t.Fatalf("got %v", err)
	}
}

func TestAMacThatIsNotEthernetIsError7(t *testing.T) {
	_, err := parseNetconf([]byte(`{"cniVersion": "1.0.0", "name": "n", "device": "d", "shared": true,
		"runtimeConfig": {"mac": "02:00:zz:00:00:01"}}`), "ADD")
	if codeOf(t, err) != codeInvalidConfig {
		t.Fatalf("got %v", err)
	}
}

func TestResult040CarriesIPVersions(t *testing.T) {
	result := map[string]any{"ips": []any{
		map[string]any{"address": "10.0.0.2/24"}, map[string]any{"address": "fd00::2/64"},
	}}
	var versions []any
	for _, ip := range shapeResult(result, "0.4.0")["ips"].([]any) {
		versions = append(versions, ip.(map[string]any)["version"])
	}
	if !reflect.DeepEqual(versions, []any{"4", "6"}) {
		t.Fatalf("got %v", versions)
	}
}

func TestResult1xCarriesNoIPVersion(t *testing.T) {
	result := map[string]any{"ips": []any{map[string]any{"address": "10.0.0.2/24", "version": "4"}}}
	ip := shapeResult(result, "1.1.0")["ips"].([]any)[0].(map[string]any)
	if _, has := ip["version"]; has {
		t.Fatalf("got %v", ip)
	}
}

func TestCdiNameIsPodNamespaceNameAndIfname(t *testing.T) {
	e := &env{ContainerID: "abc", Ifname: "net1",
		Args: map[string]string{"K8S_POD_NAMESPACE": "ml", "K8S_POD_NAME": "trainer-0"}}
	if got := cdiName(e); got != "ml.trainer-0.net1" {
		t.Fatalf("got %q", got)
	}
}

func TestPodCdiNameIsPodNamespaceAndName(t *testing.T) {
	e := &env{ContainerID: "abc", Ifname: "net1",
		Args: map[string]string{"K8S_POD_NAMESPACE": "ml", "K8S_POD_NAME": "trainer-0"}}
	if got := podCdiName(e); got != "ml.trainer-0" {
		t.Fatalf("got %q", got)
	}
}

func TestPodCdiNameFallsBackToTheContainerID(t *testing.T) {
	e := &env{ContainerID: "abc", Ifname: "net1", Args: map[string]string{}}
	if got := podCdiName(e); got != "abc" {
		t.Fatalf("got %q", got)
	}
}

func TestCdiNameFallsBackToTheContainerID(t *testing.T) {
	e := &env{ContainerID: "abc", Ifname: "net1", Args: map[string]string{}}
	if got := cdiName(e); got != "abc.net1" {
		t.Fatalf("got %q", got)
	}
}

func TestFirstOfSeveralFailuresKeepsItsCodeAndNamesTheOthers(t *testing.T) {
	err := firstOf([]error{newError(codeTryAgainLater, "a", "why a"), newError(codeIOFailure, "b")})
	cerr, ok := err.(*cniError)
	if !ok || cerr.Code != codeTryAgainLater || cerr.Msg != "a" || cerr.Details != "why a; also: b" {
		t.Fatalf("got %#v", err)
	}
}

func TestAtLeastComparesVersionsNumerically(t *testing.T) {
	for _, c := range []struct {
		version, min string
		want         bool
	}{{"1.1.0", "1.1.0", true}, {"1.0.0", "1.1.0", false}, {"0.4.0", "0.10.0", false}, {"1.0.0", "0.4.0", true}} {
		if got := atLeast(c.version, c.min); got != c.want {
			t.Errorf("atLeast(%s, %s) = %v", c.version, c.min, got)
		}
	}
}

func TestDelReadsNoMoreThanItUsesOfAConfigAddRefuses(t *testing.T) {
	conf, err := parseNetconf([]byte(`{"cniVersion": "1.0.0", "name": "n", "device": "d", "selector": {},
		"mtu": 10, "busAddress": "unix:path=/x", "ipam": {"type": "host-local"}}`), "DEL")
	if err != nil || conf.BusAddress != "unix:path=/x" || conf.IPAMType != "host-local" {
		t.Fatalf("got %v, %v", conf, err)
	}
}

func TestResultBefore100HasNoInterfaceMtu(t *testing.T) {
	result := map[string]any{"interfaces": []any{map[string]any{"name": "net1", "mtu": 1500}}}
	iface := shapeResult(result, "0.4.0")["interfaces"].([]any)[0].(map[string]any)
	if !reflect.DeepEqual(iface, map[string]any{"name": "net1"}) {
		t.Fatalf("got %v", iface)
	}
}

func TestPolicyRoutingIsOffUnlessAsked(t *testing.T) {
	conf, err := parseNetconf([]byte(`{"cniVersion": "1.0.0", "name": "n", "device": "d"}`), "ADD")
	if err != nil || conf.PolicyRouting {
		t.Fatalf("got %v, %v", conf, err)
	}
	conf, err = parseNetconf([]byte(`{"cniVersion": "1.0.0", "name": "n", "device": "d", "policyRouting": true}`), "ADD")
	if err != nil || !conf.PolicyRouting {
		t.Fatalf("got %v, %v", conf, err)
	}
}

func TestPolicyRoutingThatIsNotABooleanIsError7(t *testing.T) {
	_, err := parseNetconf([]byte(`{"cniVersion": "1.0.0", "name": "n", "device": "d", "policyRouting": "auto"}`), "ADD")
	if codeOf(t, err) != codeInvalidConfig || err.Error() != "policyRouting must be a JSON boolean" {
		t.Fatalf("got %v", err)
	}
}

func TestPolicyRoutingWithoutANetdevIsError7(t *testing.T) {
	_, err := parseNetconf([]byte(`{"cniVersion": "1.0.0", "name": "n", "device": "d", "netdev": false,
		"policyRouting": true}`), "ADD")
	if codeOf(t, err) != codeInvalidConfig {
		t.Fatalf("got %v", err)
	}
}

func TestTableRoutesGoThroughTheirGatewayOrTheFamilysOwn(t *testing.T) {
	addresses := map[string]any{
		"ips": []any{
			map[string]any{"address": "10.1.0.5/24", "gateway": "10.1.0.1"},
			map[string]any{"address": "fd00::5/64"},
		},
		"routes": []any{
			map[string]any{"dst": "0.0.0.0/0"},
			map[string]any{"dst": "10.9.0.0/16", "gw": "10.1.0.254"},
			map[string]any{"dst": "fd99::/64"},
		},
	}
	want := []string{"0.0.0.0/0,via=10.1.0.1", "10.9.0.0/16,via=10.1.0.254", "fd99::/64"}
	if got := tableRoutes(addresses); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q", got)
	}
}
