package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// The plugin's input, decoded and checked before anything is touched (errors 1, 4, 6, 7).

var verbs = []string{"ADD", "DEL", "CHECK", "VERSION", "STATUS", "GC"}

var (
	// The spec's rule: a network name and a container id are alphanumerics plus "_.-".
	validName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.\-]*$`)
	// What the kernel accepts as a netdev name.
	validIfname = regexp.MustCompile(`^[^/:\s\x00]{1,15}$`)
	validPCI    = regexp.MustCompile(`^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$`)
)

var (
	selectorKeys = []string{"driver", "linkLayer", "netdev", "numaNode", "pciAddress"}
	chardevKinds = []string{"uverbs", "rdma_cm", "umad", "issm"}
)

const (
	ownerPrefix   = "cni"
	ownerMaxBytes = 256 // rdmad's limit on a claim's owner
)

type env struct {
	Command     string
	ContainerID string
	Netns       string
	Ifname      string
	Args        map[string]string
	Path        []string
}

type selector struct {
	Driver     string
	LinkLayer  string
	Netdev     string
	NumaNode   *int
	PCIAddress string // a prefix: "0000:3b:" matches every function on that bus
}

// attachment is one entry of cni.dev/valid-attachments (GC).
type attachment struct {
	ContainerID string
	Ifname      string
}

type netConf struct {
	Version          string
	Name             string
	Raw              []byte // as read: handed unchanged to the IPAM plugin
	Device           string
	DeviceID         string
	Selector         *selector
	Shared           bool
	MTU              *uint32
	Chardevs         []string
	Netdev           bool
	PolicyRouting    bool // the IPAM routes go in the claim's own table (rdmad's table option)
	Pod              bool // attach what rdmad holds for the pod (K8S_POD_UID): cni/pod.go
	BusAddress       string
	IPAMType         string
	PrevResult       map[string]any
	MAC              string
	DeviceInfoFile   string
	ValidAttachments []attachment
}

// attachmentOwner is the claim's owner label: the attachment it belongs to, as the spec
// identifies it. "/" separates the parts: none of the three may contain one.
func attachmentOwner(network, containerID, ifname string) string {
	return ownerPrefix + "/" + network + "/" + containerID + "/" + ifname
}

// parseOwner gives (network, container id, ifname) of a claim this plugin made.
func parseOwner(owner string) (network, containerID, ifname string, ok bool) {
	parts := strings.Split(owner, "/")
	if len(parts) != 4 || parts[0] != ownerPrefix {
		return "", "", "", false
	}
	return parts[1], parts[2], parts[3], true
}

func contains(list []string, item string) bool {
	for _, v := range list {
		if v == item {
			return true
		}
	}
	return false
}

func parseEnv(environ map[string]string) (*env, error) {
	command := environ["CNI_COMMAND"]
	if !contains(verbs, command) {
		return nil, newError(codeInvalidEnv,
			fmt.Sprintf("CNI_COMMAND %q is not one of %s", command, strings.Join(verbs, ", ")))
	}
	path := cniPath(environ)
	if command == "VERSION" || command == "STATUS" || command == "GC" {
		return &env{Command: command, Args: map[string]string{}, Path: path}, nil
	}
	containerID := environ["CNI_CONTAINERID"]
	if !validName.MatchString(containerID) {
		return nil, newError(codeInvalidEnv,
			fmt.Sprintf("CNI_CONTAINERID %q is missing or invalid", containerID))
	}
	ifname := environ["CNI_IFNAME"]
	if !validIfname.MatchString(ifname) || ifname == "." || ifname == ".." {
		return nil, newError(codeInvalidEnv,
			fmt.Sprintf("CNI_IFNAME %q is missing or not a valid name", ifname))
	}
	netns := environ["CNI_NETNS"]
	if command != "DEL" && netns == "" {
		return nil, newError(codeInvalidEnv, "CNI_NETNS is required for "+command)
	}
	args, err := cniArgs(environ["CNI_ARGS"])
	if err != nil {
		return nil, err
	}
	return &env{command, containerID, netns, ifname, args, path}, nil
}

func cniPath(environ map[string]string) []string {
	var out []string
	for _, dir := range strings.Split(environ["CNI_PATH"], ":") {
		if dir != "" {
			out = append(out, dir)
		}
	}
	return out
}

func cniArgs(text string) (map[string]string, error) {
	out := map[string]string{}
	for _, pair := range strings.Split(text, ";") {
		if pair == "" {
			continue
		}
		key, value, found := strings.Cut(pair, "=")
		if !found {
			return nil, newError(codeInvalidEnv, fmt.Sprintf("CNI_ARGS: %q is not KEY=VALUE", pair))
		}
		out[key] = value
	}
	return out, nil
}

// jsonObject reads one JSON object; numbers stay as written (json.Number), so that an
// integer key can refuse 1.5 and a number passed through keeps its form.
func jsonObject(raw []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("data after the object")
	}
	obj, ok := doc.(map[string]any)
	if !ok {
		return nil, errors.New("not a JSON object")
	}
	return obj, nil
}

func decode(raw []byte) (map[string]any, error) {
	doc, err := jsonObject(raw)
	if err != nil {
		return nil, newError(codeDecodeFailure, "the network configuration is not a JSON object", err.Error())
	}
	return doc, nil
}

// requestedVersion is the config's cniVersion for shaping an error, when it is one we speak.
func requestedVersion(raw []byte) string {
	doc, err := decode(raw)
	if err != nil {
		return latestVersion
	}
	if v, ok := doc["cniVersion"].(string); ok && supported(v) {
		return v
	}
	return latestVersion
}

// typed reads doc[key] as a T (absent or null: def); a value of another JSON type is
// error 7, named after the key.
func typed[T any](doc map[string]any, key string, def T) (T, error) {
	value, present := doc[key]
	if !present || value == nil {
		return def, nil
	}
	v, ok := value.(T)
	if !ok {
		return def, newError(codeInvalidConfig, fmt.Sprintf("%s must be a JSON %s", key, jsonKind(def)))
	}
	return v, nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case bool:
		return "boolean"
	case []any:
		return "array"
	default:
		return "object"
	}
}

// integer is a JSON number without a fraction or exponent.
func integer(value any) (int64, bool) {
	n, ok := value.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := strconv.ParseInt(n.String(), 10, 64)
	return i, err == nil
}

func parseNetconf(raw []byte, command string) (*netConf, error) {
	doc, err := decode(raw)
	if err != nil {
		return nil, err
	}
	version, ok := doc["cniVersion"].(string)
	if !ok {
		return nil, newError(codeInvalidConfig, "cniVersion is missing")
	}
	if !supported(version) {
		return nil, newError(codeIncompatibleVersion,
			fmt.Sprintf("cniVersion %s is not supported", version),
			"supported: "+strings.Join(supportedVersions, ", "))
	}
	c := &netConf{Version: version, Raw: raw}
	if c.Name, err = typed(doc, "name", ""); err != nil {
		return nil, err
	}
	if !validName.MatchString(c.Name) {
		return nil, newError(codeInvalidConfig, fmt.Sprintf("name %q is missing or invalid", c.Name))
	}
	if c.BusAddress, err = typed(doc, "busAddress", ""); err != nil {
		return nil, err
	}
	ipam, err := typed(doc, "ipam", map[string]any{})
	if err != nil {
		return nil, err
	}
	if len(ipam) > 0 {
		if c.IPAMType, err = typed(ipam, "type", ""); err != nil {
			return nil, err
		}
		if !validName.MatchString(c.IPAMType) {
			return nil, newError(codeInvalidConfig, "ipam.type is missing or invalid")
		}
	}
	if command == "GC" {
		if c.ValidAttachments, err = parseValidAttachments(doc); err != nil {
			return nil, err
		}
	}
	if c.Pod, err = typed(doc, "pod", false); err != nil {
		return nil, err
	}
	// DEL, GC and STATUS need no more than the above: the rest shapes an attachment, and a
	// config ADD refused must not fail the DEL that follows it (a runtime retries a failed
	// DEL: in Kubernetes the pod would never go).
	if command != "ADD" && command != "CHECK" {
		return c, nil
	}
	runtime, err := typed(doc, "runtimeConfig", map[string]any{})
	if err != nil {
		return nil, err
	}
	// runtimeConfig's deviceID and CNIDeviceInfoFile count where the top level has none
	// (Multus injects either): a key already set skips its later source.
	for _, f := range []struct {
		obj  map[string]any
		key  string
		into *string
	}{
		{doc, "device", &c.Device},
		{doc, "deviceID", &c.DeviceID},
		{runtime, "deviceID", &c.DeviceID},
		{doc, "CNIDeviceInfoFile", &c.DeviceInfoFile},
		{runtime, "CNIDeviceInfoFile", &c.DeviceInfoFile},
		{runtime, "mac", &c.MAC},
	} {
		if *f.into != "" {
			continue
		}
		if *f.into, err = typed(f.obj, f.key, ""); err != nil {
			return nil, err
		}
	}
	if c.Selector, err = parseSelector(doc["selector"]); err != nil {
		return nil, err
	}
	if c.Pod {
		return podNetconf(c, doc)
	}
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
		return nil, newError(codeInvalidConfig, msg)
	}
	if c.DeviceID != "" && !validPCI.MatchString(c.DeviceID) {
		return nil, newError(codeInvalidConfig, fmt.Sprintf("deviceID %q is not a PCI address", c.DeviceID))
	}
	if mtu, present := doc["mtu"]; present && mtu != nil {
		n, ok := integer(mtu)
		if !ok || n < 68 || n > 65535 {
			return nil, newError(codeInvalidConfig, fmt.Sprintf("mtu %v is not an integer in 68-65535", mtu))
		}
		m := uint32(n)
		c.MTU = &m
	}
	if c.Chardevs, err = parseChardevs(doc); err != nil {
		return nil, err
	}
	if c.Shared, err = typed(doc, "shared", false); err != nil {
		return nil, err
	}
	if c.Netdev, err = typed(doc, "netdev", true); err != nil {
		return nil, err
	}
	if c.PolicyRouting, err = typed(doc, "policyRouting", false); err != nil {
		return nil, err
	}
	if c.PolicyRouting && !c.Netdev {
		return nil, newError(codeInvalidConfig, "policyRouting needs a netdev in the container (netdev=false)")
	}
	if c.Shared && !c.Netdev {
		return nil, newError(codeInvalidConfig, "netdev=false applies to whole-device claims only")
	}
	if c.IPAMType != "" && !c.Netdev {
		return nil, newError(codeInvalidConfig, "ipam needs a netdev in the container (netdev=false)")
	}
	if c.MAC != "" {
		if !c.Shared {
			return nil, newError(codeInvalidConfig,
				"the mac capability applies to shared claims only: a whole device keeps its own MAC")
		}
		if hw, err := net.ParseMAC(c.MAC); err != nil || len(hw) != 6 {
			return nil, newError(codeInvalidConfig, fmt.Sprintf("mac %q is not an Ethernet address", c.MAC))
		}
	}
	if prev, present := doc["prevResult"]; present && prev != nil {
		obj, ok := prev.(map[string]any)
		if !ok {
			return nil, newError(codeInvalidConfig, "prevResult is not an object")
		}
		c.PrevResult = obj
	}
	return c, nil
}

// podNetconf finishes a pod-mode config: the device and its options are the hold's, made
// by rdmad-dra from the pod's ResourceClaim, so a config naming any of them is refused.
func podNetconf(c *netConf, doc map[string]any) (*netConf, error) {
	for _, key := range []string{"device", "deviceID", "selector", "shared", "mtu", "chardevs", "netdev", "policyRouting", "mac"} {
		if _, present := doc[key]; present || (key == "deviceID" && c.DeviceID != "") || (key == "mac" && c.MAC != "") {
			return nil, newError(codeInvalidConfig, fmt.Sprintf("%s does not go with pod: the pod's ResourceClaim chose the device and its options", key))
		}
	}
	if prev, present := doc["prevResult"]; present && prev != nil {
		obj, ok := prev.(map[string]any)
		if !ok {
			return nil, newError(codeInvalidConfig, "prevResult is not an object")
		}
		c.PrevResult = obj
	}
	return c, nil
}

func parseChardevs(doc map[string]any) ([]string, error) {
	listed, err := typed(doc, "chardevs", []any{})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, item := range listed {
		kind, ok := item.(string)
		if !ok || !contains(chardevKinds, kind) {
			return nil, newError(codeInvalidConfig,
				fmt.Sprintf("chardevs: %v is not one of %s", item, strings.Join(chardevKinds, ", ")))
		}
		out = append(out, kind)
	}
	return out, nil
}

func parseSelector(value any) (*selector, error) {
	if value == nil {
		return nil, nil
	}
	obj, ok := value.(map[string]any)
	if !ok || len(obj) == 0 {
		return nil, newError(codeInvalidConfig, "selector must be a non-empty object")
	}
	var unknown []string
	for key := range obj {
		if !contains(selectorKeys, key) {
			unknown = append(unknown, key)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, newError(codeInvalidConfig, fmt.Sprintf("selector: unknown key %q (known: %s)",
			unknown[0], strings.Join(selectorKeys, ", ")))
	}
	s := &selector{}
	if numa, present := obj["numaNode"]; present && numa != nil {
		n, ok := integer(numa)
		if !ok {
			return nil, newError(codeInvalidConfig, "selector.numaNode must be an integer")
		}
		i := int(n)
		s.NumaNode = &i
	}
	for key, into := range map[string]*string{
		"driver": &s.Driver, "linkLayer": &s.LinkLayer, "netdev": &s.Netdev, "pciAddress": &s.PCIAddress,
	} {
		text, err := typed(obj, key, "")
		if err != nil {
			return nil, newError(codeInvalidConfig, fmt.Sprintf("selector.%s must be a string", key))
		}
		*into = text
	}
	return s, nil
}

// validAttachmentKeys name GC's list of still-valid attachments: the key libcni has always
// sent, then the one the published 1.1.0 spec text named (corrected later; libcni since
// 1.2.3 sends both). A runtime that follows the spec text sends only the second: read as
// "none valid", it would release every claim of the network.
var validAttachmentKeys = []string{"cni.dev/valid-attachments", "cni.dev/attachments"}

func parseValidAttachments(doc map[string]any) ([]attachment, error) {
	key, listed := "", any(nil)
	for _, k := range validAttachmentKeys {
		if v := doc[k]; v != nil {
			key, listed = k, v
			break
		}
	}
	if listed == nil {
		return nil, nil
	}
	items, ok := listed.([]any)
	if !ok {
		return nil, newError(codeInvalidConfig, key+" must be an array")
	}
	var out []attachment
	for _, item := range items {
		obj, ok := item.(map[string]any)
		container, isText := obj["containerID"].(string)
		if !ok || !isText {
			return nil, newError(codeInvalidConfig, key+": entries need containerID")
		}
		ifname, _ := obj["ifname"].(string)
		out = append(out, attachment{container, ifname})
	}
	return out, nil
}
