package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/godbus/dbus"
)

// RDMA limits: the config's keys, checked, and the claim options they become, with the
// pod's cgroup found on a fake cgroup tree.

const podUID = "8d3f0c1e-2b4a-4c6d-9e8f-0a1b2c3d4e5f"

// cgroupTree is a fake cgroup2 mount holding the given directories.
func cgroupTree(t *testing.T, dirs ...string) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestLoadNetConfRefusesLimitsItCannotApply(t *testing.T) {
	for _, tc := range []struct {
		name    string
		members string
		msg     string
	}{
		{"hcaHandles over the kernel's range", `"device": "d", "hcaHandles": 2147483647`, "hcaHandles 2147483647 is out of range 0-2147483646"},
		{"hcaObjects negative", `"device": "d", "hcaObjects": -1`, "the network configuration does not decode"},
		{"hcaObjects over 32 bits", `"device": "d", "hcaObjects": 4294967296`, "the network configuration does not decode"},
		{"hcaHandles not a number", `"device": "d", "hcaHandles": "1"`, "the network configuration does not decode"},
		{"cgroup with a NUL", `"device": "d", "cgroup": "a\u0000b"`, `cgroup "a\x00b" is not a path`},
		{"pod with a limit", `"pod": true, "hcaHandles": 1`, "hcaHandles does not go with pod"},
		{"pod with a cgroup", `"pod": true, "cgroup": "x"`, "cgroup does not go with pod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadNetConf(conf(tc.members))
			if codeOf(t, err) != types.ErrInvalidNetworkConfig || !strings.HasPrefix(err.(*types.Error).Msg, tc.msg) {
				t.Fatalf("got %v, want error 7 %q", err, tc.msg)
			}
		})
	}
}

func TestPodCgroupIsFoundUnderEitherDriverAndEveryQoSClass(t *testing.T) {
	unit := strings.ReplaceAll(podUID, "-", "_")
	for _, tc := range []struct{ name, cgroup string }{
		{"systemd guaranteed", "kubepods.slice/kubepods-pod" + unit + ".slice"},
		{"systemd burstable", "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + unit + ".slice"},
		{"systemd besteffort", "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + unit + ".slice"},
		{"cgroupfs guaranteed", "kubepods/pod" + podUID},
		{"cgroupfs burstable", "kubepods/burstable/pod" + podUID},
		{"cgroupfs besteffort", "kubepods/besteffort/pod" + podUID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := cgroupTree(t, tc.cgroup, "kubepods/besteffort/pod0000", "kubepods.slice/kubepods-pod0000.slice")
			if got, err := findPodCgroup(root, podUID); err != nil || got != tc.cgroup {
				t.Fatalf("got %q, %v", got, err)
			}
		})
	}
}

func TestPodCgroupErrors(t *testing.T) {
	for _, tc := range []struct {
		name, uid string
		code      uint
	}{
		{"no cgroup for the pod", podUID, codeNoSuchCgroup},
		{"a UID that leaves the directory", "../../x", types.ErrInvalidEnvironmentVariables},
		{"an empty-looking UID", "pod/", types.ErrInvalidEnvironmentVariables},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := cgroupTree(t, "kubepods/burstable/pod1111")
			if _, err := findPodCgroup(root, tc.uid); codeOf(t, err) != tc.code {
				t.Fatalf("got %v, want code %d", err, tc.code)
			}
		})
	}
}

func TestLimitsBecomeClaimOptions(t *testing.T) {
	one, many := uint32(1), uint32(64)
	cgroupfs := "kubepods/burstable/pod" + podUID
	for _, tc := range []struct {
		name   string
		limits Limits
		podUID string
		want   map[string]dbus.Variant
	}{
		{"none", Limits{}, podUID, map[string]dbus.Variant{}},
		{"the config's cgroup wins over the pod's", Limits{Cgroup: "rdma.slice", HcaHandles: &one}, podUID,
			map[string]dbus.Variant{"cgroup": dbus.MakeVariant("rdma.slice"), "hca_handles": dbus.MakeVariant(one)}},
		{"a cgroup alone (its usage only)", Limits{Cgroup: "rdma.slice"}, "",
			map[string]dbus.Variant{"cgroup": dbus.MakeVariant("rdma.slice")}},
		{"the pod's cgroup for a limit", Limits{HcaHandles: &one, HcaObjects: &many}, podUID,
			map[string]dbus.Variant{"cgroup": dbus.MakeVariant(cgroupfs), "hca_handles": dbus.MakeVariant(one), "hca_objects": dbus.MakeVariant(many)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.limits.options(tc.podUID, cgroupTree(t, cgroupfs))
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestALimitWithoutACgroupOrAPodIsRefused(t *testing.T) {
	one := uint32(1)
	_, err := (&Limits{HcaObjects: &one}).options("", cgroupTree(t))
	if codeOf(t, err) != types.ErrInvalidNetworkConfig {
		t.Fatalf("got %v, want error 7", err)
	}
}
