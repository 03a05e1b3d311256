package main

import (
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
)

// The CNI spec versions this plugin speaks; VERSION lists them, and a result or an error
// is shaped for the version the config asks for. 0.3.x is 0.4.0 without CHECK: many
// Multus NetworkAttachmentDefinitions (and the sriov-cni and rdma-cni examples) say 0.3.1.
var supportedVersions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

const latestVersion = "1.1.0"

// Error codes of the CNI spec (1.1.0, "Error" section); 100 and up are the plugin's own.
const (
	codeIncompatibleVersion = 1
	codeInvalidEnv          = 4
	codeIOFailure           = 5
	codeDecodeFailure       = 6
	codeInvalidConfig       = 7
	codeTryAgainLater       = 11
	codeNotAvailable        = 50 // STATUS: the plugin cannot serve ADDs now
	codeRdmadFailed         = 100
	codeCheckFailed         = 120 // CHECK found the attachment incomplete
)

// cniError is a failure the runtime sees as the spec's error object and a non-zero exit.
type cniError struct {
	Code    int
	Msg     string
	Details string
}

func (e *cniError) Error() string { return e.Msg }

func newError(code int, msg string, details ...string) *cniError {
	return &cniError{Code: code, Msg: msg, Details: strings.Join(details, "; ")}
}

func (e *cniError) document(version string) map[string]any {
	out := map[string]any{"cniVersion": version, "code": e.Code, "msg": e.Msg}
	if e.Details != "" {
		out["details"] = e.Details
	}
	return out
}

// atLeast: version is min or later ("X.Y.Z", as supportedVersions spell them).
func atLeast(version, min string) bool {
	parse := func(v string) (out [3]int) {
		for i, part := range strings.SplitN(v, ".", 3) {
			out[i], _ = strconv.Atoi(part)
		}
		return out
	}
	a, b := parse(version), parse(min)
	for i := range a {
		if a[i] != b[i] {
			return a[i] > b[i]
		}
	}
	return true
}

// firstOf is the first of several failures, with its code; the others are named in its
// details (GC goes on past a failure and reports them all). nil when there are none.
func firstOf(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	var first *cniError
	if !errors.As(errs[0], &first) {
		first = newError(codeRdmadFailed, errs[0].Error())
	}
	if len(errs) == 1 {
		return first
	}
	var details []string
	if first.Details != "" {
		details = append(details, first.Details)
	}
	for _, err := range errs[1:] {
		details = append(details, "also: "+err.Error())
	}
	return newError(first.Code, first.Msg, details...)
}

func supported(version string) bool {
	for _, v := range supportedVersions {
		if v == version {
			return true
		}
	}
	return false
}

// shapeResult puts a result built in the 1.x shape into the shape `version` asks for.
// Before 1.0.0 (libcni's types040: 0.3.0 to 0.4.0) each IP carries its "version" ("4" or
// "6"), and an interface has no "mtu".
func shapeResult(result map[string]any, version string) map[string]any {
	out := map[string]any{"cniVersion": version}
	for k, v := range result {
		out[k] = v
	}
	legacy := !atLeast(version, "1.0.0")
	ips := []any{}
	for _, item := range listOf(result["ips"]) {
		ip := copyObject(item)
		delete(ip, "version")
		if legacy {
			ip["version"] = "4"
			if addr, _ := ip["address"].(string); strings.Contains(addr, ":") {
				ip["version"] = "6"
			}
		}
		ips = append(ips, ip)
	}
	out["ips"] = ips
	if legacy {
		interfaces := []any{}
		for _, item := range listOf(result["interfaces"]) {
			iface := copyObject(item)
			delete(iface, "mtu")
			interfaces = append(interfaces, iface)
		}
		out["interfaces"] = interfaces
	}
	return out
}

func versionInfo() map[string]any {
	return map[string]any{"cniVersion": latestVersion, "supportedVersions": supportedVersions}
}

func emit(out io.Writer, doc map[string]any) {
	// a write error has no one left to report to: the runtime reads an empty result
	_ = json.NewEncoder(out).Encode(doc)
}

// listOf is a JSON array's items, or none when the value is not an array.
func listOf(value any) []any {
	items, _ := value.([]any)
	return items
}

// copyObject is a shallow copy of a JSON object (an empty one when the value is not one).
func copyObject(value any) map[string]any {
	out := map[string]any{}
	if obj, ok := value.(map[string]any); ok {
		for k, v := range obj {
			out[k] = v
		}
	}
	return out
}
