package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/godbus/dbus"
)

// RDMA limits (rdmad's claim options cgroup, hca_handles, hca_objects): the config's
// hcaHandles and hcaObjects go into a cgroup's rdma.max for the claimed device. The cgroup
// is the config's cgroup, else the pod's (K8S_POD_UID), found where the kubelet puts it,
// as rdmad-dra finds it (rdmad/dra/podcgroup.py): the kubelet makes the pod's cgroup
// before the runtime's RunPodSandbox runs CNI.
//
//	systemd driver:   kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid>.slice,
//	                  with the UID's dashes as underscores
//	cgroupfs driver:  kubepods/<qos>/pod<uid>
//
// with <qos> burstable or besteffort; a guaranteed pod's sits directly under kubepods.

// cgroupMount is the host's cgroup2 mount, where the plugin (run by the runtime, on the
// host) looks for the pod's cgroup; rdmad reads the relative path against its own.
const cgroupMount = "/sys/fs/cgroup"

// rdmaLimitMax is the largest value rdma.max keeps as a limit (rdmad/options.py).
const rdmaLimitMax = 1<<31 - 2

var podUIDPattern = regexp.MustCompile(`^[0-9A-Fa-f-]{1,64}$`) // a UUID: nothing that leaves a directory

// Limits are the config's RDMA limit keys.
type Limits struct {
	Cgroup     string  `json:"cgroup,omitempty"`
	HcaHandles *uint32 `json:"hcaHandles,omitempty"`
	HcaObjects *uint32 `json:"hcaObjects,omitempty"`
}

func (l *Limits) limited() bool { return l.HcaHandles != nil || l.HcaObjects != nil }

func (l *Limits) check() error {
	for _, v := range []struct {
		key   string
		value *uint32
	}{{"hcaHandles", l.HcaHandles}, {"hcaObjects", l.HcaObjects}} {
		if v.value != nil && *v.value > rdmaLimitMax {
			return invalid("%s %d is out of range 0-%d", v.key, *v.value, rdmaLimitMax)
		}
	}
	if strings.ContainsRune(l.Cgroup, 0) {
		return invalid("cgroup %q is not a path", l.Cgroup)
	}
	return nil
}

// options are the claim options of the limits: the cgroup is the config's, else the
// pod's; a limit with neither is refused (error 7), a pod's cgroup not found is
// NoSuchCgroup. No limit and no cgroup adds nothing.
func (l *Limits) options(podUID, mount string) (map[string]dbus.Variant, error) {
	options := map[string]dbus.Variant{}
	cgroup := l.Cgroup
	if cgroup == "" && l.limited() {
		if podUID == "" {
			return nil, invalid("hcaHandles and hcaObjects need a cgroup: cgroup in the config, or K8S_POD_UID in CNI_ARGS")
		}
		var err error
		if cgroup, err = findPodCgroup(mount, podUID); err != nil {
			return nil, err
		}
	}
	if cgroup != "" {
		options["cgroup"] = dbus.MakeVariant(cgroup)
	}
	if l.HcaHandles != nil {
		options["hca_handles"] = dbus.MakeVariant(*l.HcaHandles)
	}
	if l.HcaObjects != nil {
		options["hca_objects"] = dbus.MakeVariant(*l.HcaObjects)
	}
	return options, nil
}

// podCgroups are the pod's cgroup under each driver and QoS class, relative to the mount.
func podCgroups(podUID string) []string {
	unit := strings.ReplaceAll(podUID, "-", "_")
	out := []string{"kubepods.slice/kubepods-pod" + unit + ".slice"}
	for _, qos := range []string{"burstable", "besteffort"} {
		out = append(out, fmt.Sprintf("kubepods.slice/kubepods-%s.slice/kubepods-%s-pod%s.slice", qos, qos, unit))
	}
	out = append(out, "kubepods/pod"+podUID)
	for _, qos := range []string{"burstable", "besteffort"} {
		out = append(out, "kubepods/"+qos+"/pod"+podUID)
	}
	return out
}

// findPodCgroup is the pod's cgroup that exists under mount, relative to it.
func findPodCgroup(mount, podUID string) (string, error) {
	if !podUIDPattern.MatchString(podUID) {
		return "", types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("K8S_POD_UID %q is not a UUID", podUID), "")
	}
	candidates := podCgroups(podUID)
	for _, c := range candidates {
		if info, err := os.Stat(filepath.Join(mount, c)); err == nil && info.IsDir() {
			return c, nil
		}
	}
	return "", types.NewError(codeNoSuchCgroup,
		fmt.Sprintf("hcaHandles/hcaObjects need the cgroup of pod %s, and %s has none of %s", podUID, mount, strings.Join(candidates, ", ")), "")
}
