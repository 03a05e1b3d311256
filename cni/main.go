// rdmad-cni: a CNI plugin (type "rdmad") that turns a runtime's ADD/DEL into rdmad claims.
//
// Written in Go, like the reference plugins: a plugin run is a process start on every pod
// start and stop, and CPython's start and imports alone took longer than the ADD's budget.
// The CNI project's library (skel) reads the environment, negotiates the version and
// writes the error document; the verbs are in verbs.go and pod.go.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"
)

// The spec versions it speaks: 0.3.x is 0.4.0 without CHECK, and many Multus
// NetworkAttachmentDefinitions (and the sriov-cni and rdma-cni examples) say 0.3.1.
var supported = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    cmdAdd,
		Del:    cmdDel,
		Check:  cmdCheck,
		GC:     cmdGC,
		Status: cmdStatus,
	}, supported, "CNI plugin rdmad: RDMA devices claimed from rdmad (io.rdmad1)")
}
