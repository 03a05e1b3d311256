package main

import (
	"context"
	"errors"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// IPAM delegation, the library's (invoke.Delegate*, which the reference plugins' ipam.Exec*
// wrap): the plugin ipam.type names, found in CNI_PATH, run with this run's environment and
// configuration; its stderr is the runtime's too.

type delegateFunc func(ctx context.Context, plugin string, netconf []byte, exec invoke.Exec) error

// ipam runs one verb of the IPAM plugin; its error keeps the plugin's code.
func ipam(verb delegateFunc, kind string, stdin []byte) error {
	return ipamError(kind, verb(context.TODO(), kind, stdin, nil))
}

// ipamAdd is the IPAM plugin's ADD, its result in the current shape. A failed ADD gets its
// DEL (the spec's delegation procedure), for whatever the IPAM plugin kept of it.
func ipamAdd(kind string, stdin []byte) (*current.Result, error) {
	r, err := invoke.DelegateAdd(context.TODO(), kind, stdin, nil)
	var result *current.Result
	if err == nil {
		result, err = current.NewResultFromResult(r)
	}
	if err != nil {
		_ = ipam(invoke.DelegateDel, kind, stdin)
		return nil, ipamError(kind, err)
	}
	return result, nil
}

// ipamDelFor is the IPAM plugin's DEL of another attachment than this run's (GC's).
func ipamDelFor(kind string, args *skel.CmdArgs, a types.GCAttachment) error {
	plugin, err := invoke.FindInPath(kind, filepath.SplitList(args.Path))
	if err != nil {
		return ipamError(kind, err)
	}
	its := &invoke.Args{Command: "DEL", ContainerID: a.ContainerID, IfName: a.IfName,
		PluginArgsStr: args.Args, Path: args.Path}
	return ipamError(kind, invoke.ExecPluginWithoutResult(context.TODO(), plugin, args.StdinData, its, nil))
}

// ipamError names the IPAM plugin in its error. A plugin that failed without an error
// document is an I/O failure; one not found (or not understood) is the config's.
func ipamError(kind string, err error) error {
	if err == nil {
		return nil
	}
	var e *types.Error
	if !errors.As(err, &e) {
		return types.NewError(types.ErrInvalidNetworkConfig, "IPAM "+kind+": "+err.Error(), "")
	}
	code := e.Code
	if code == 0 {
		code = types.ErrIOFailure
	}
	return types.NewError(code, "IPAM "+kind+": "+e.Msg, e.Details)
}
