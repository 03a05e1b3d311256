package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/godbus/dbus"
)

// A small blocking client of rdmad's io.rdmad1 API.

const (
	busName     = "io.rdmad1"
	rootPath    = dbus.ObjectPath("/io/rdmad1")
	manager     = "io.rdmad1.Manager"
	deviceIface = "io.rdmad1.Device"
	claimIface  = "io.rdmad1.Claim"
	systemBus   = "unix:path=/run/dbus/system_bus_socket"
	// A claim moves a netdev between netns (tens of ms); this bounds a wedged daemon only.
	callTimeout = 30 * time.Second
)

// Bus errors that mean "rdmad is not there right now": the runtime may try again.
var notThere = []string{
	"org.freedesktop.DBus.Error.ServiceUnknown",
	"org.freedesktop.DBus.Error.NameHasNoOwner",
	"org.freedesktop.DBus.Error.NoReply",
	"org.freedesktop.DBus.Error.Timeout",
	"org.freedesktop.DBus.Error.TimedOut",
	"org.freedesktop.DBus.Error.Disconnected",
	"org.freedesktop.DBus.Error.Spawn.ChildExited",
}

// rdmad's own errors (rdmad/errors.py, each class's dbus_name), each its CNI code (100 and
// up); anything else is codeRdmadFailed. tests/unit/test_cni_error_names.py keeps the two
// lists one.
var errorCodes = map[string]uint{
	"io.rdmad1.Error.Failed":                  100,
	"io.rdmad1.Error.NoSuchDevice":            101,
	"io.rdmad1.Error.DeviceBusy":              102,
	"io.rdmad1.Error.InvalidNetns":            103,
	"io.rdmad1.Error.NotSupported":            104,
	"io.rdmad1.Error.Unavailable":             105,
	"io.rdmad1.Error.KernelError":             106,
	"io.rdmad1.Error.NoSuchClaim":             107,
	"io.rdmad1.Error.ModeBusy":                108,
	"org.freedesktop.DBus.Error.InvalidArgs":  109,
	"org.freedesktop.DBus.Error.AccessDenied": 110,
	"io.rdmad1.Error.NoSuchCgroup":            111,
}

var (
	codeRdmadFailed  = errorCodes["io.rdmad1.Error.Failed"]
	codeDeviceBusy   = errorCodes["io.rdmad1.Error.DeviceBusy"]
	codeNoSuchDevice = errorCodes["io.rdmad1.Error.NoSuchDevice"]
	codeNoSuchClaim  = errorCodes["io.rdmad1.Error.NoSuchClaim"]
	codeNoSuchCgroup = errorCodes["io.rdmad1.Error.NoSuchCgroup"]
)

type device struct {
	Name       string
	Driver     string
	LinkLayer  string
	Netdev     string
	PCIAddress string
	NumaNode   int
	State      string
	Claims     int
}

// claimRow is a live claim as ListClaims lists it.
type claimRow struct {
	ID     string
	Device string
	Netns  string // net:[INODE]
	Ifname string
	Owner  string
	Path   dbus.ObjectPath
}

// busAddress is the config's busAddress, else the system bus (DBUS_SYSTEM_BUS_ADDRESS if set).
func busAddress(configured string) string {
	if configured != "" {
		return configured
	}
	if env := os.Getenv("DBUS_SYSTEM_BUS_ADDRESS"); env != "" {
		return env
	}
	return systemBus
}

// rdmad is one connection; every call fails with the error document the spec wants.
type rdmad struct {
	conn *dbus.Conn
}

func connect(address string) (*rdmad, error) {
	conn, err := dbus.Connect(address)
	if err != nil {
		return nil, types.NewError(types.ErrTryAgainLater, "rdmad is not reachable", fmt.Sprintf("bus %s: %v", address, err))
	}
	return &rdmad{conn}, nil
}

func (r *rdmad) close() { _ = r.conn.Close() }

func (r *rdmad) call(path dbus.ObjectPath, method string, out []any, args ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	call := r.conn.Object(busName, path).CallWithContext(ctx, method, 0, args...)
	if call.Err != nil {
		return busError(call.Err)
	}
	if err := call.Store(out...); err != nil {
		return types.NewError(codeRdmadFailed, "rdmad's reply to "+method+" is not what io.rdmad1 says", err.Error())
	}
	return nil
}

func busError(err error) error {
	var reply dbus.Error
	if !errors.As(err, &reply) {
		return types.NewError(types.ErrTryAgainLater, "rdmad did not answer", err.Error())
	}
	text := ""
	if len(reply.Body) > 0 {
		text = fmt.Sprint(reply.Body[0])
	}
	if contains(notThere, reply.Name) {
		return types.NewError(types.ErrTryAgainLater, "rdmad is not running", reply.Name+": "+text)
	}
	code, known := errorCodes[reply.Name]
	if !known {
		code = codeRdmadFailed
	}
	return types.NewError(code, reply.Name+": "+text, "")
}

func (r *rdmad) version() (string, error) {
	var v dbus.Variant
	err := r.call(rootPath, "org.freedesktop.DBus.Properties.Get", []any{&v}, manager, "Version")
	return fmt.Sprint(v.Value()), err
}

// devices lists every device with the properties a selector reads, in one call.
func (r *rdmad) devices() ([]device, error) {
	var managed map[dbus.ObjectPath]map[string]map[string]dbus.Variant
	err := r.call(rootPath, "org.freedesktop.DBus.ObjectManager.GetManagedObjects", []any{&managed})
	if err != nil {
		return nil, err
	}
	var out []device
	for _, ifaces := range managed {
		p, isDevice := ifaces[deviceIface]
		if !isDevice {
			continue
		}
		d := device{}
		for key, into := range map[string]*string{
			"Name": &d.Name, "Driver": &d.Driver, "LinkLayer": &d.LinkLayer,
			"NetDevice": &d.Netdev, "PciAddress": &d.PCIAddress, "State": &d.State,
		} {
			*into, _ = p[key].Value().(string)
		}
		numa, _ := p["NumaNode"].Value().(int32)
		d.NumaNode = int(numa)
		claims, _ := p["Claims"].Value().([]dbus.ObjectPath)
		d.Claims = len(claims)
		out = append(out, d)
	}
	return out, nil
}

func (r *rdmad) claims() ([]claimRow, error) {
	var rows []claimRow
	err := r.call(rootPath, manager+".ListClaims", []any{&rows})
	return rows, err
}

// claim makes a claim and returns it as ListClaims would list it.
func (r *rdmad) claim(device, netns string, options map[string]dbus.Variant) (claimRow, error) {
	var path dbus.ObjectPath
	if err := r.call(rootPath, manager+".Claim", []any{&path}, device, netns, options); err != nil {
		return claimRow{}, err
	}
	return r.claimAt(path)
}

// claimAt reads the claim at path as ListClaims would list it.
func (r *rdmad) claimAt(path dbus.ObjectPath) (claimRow, error) {
	var p map[string]dbus.Variant
	err := r.call(path, "org.freedesktop.DBus.Properties.GetAll", []any{&p}, claimIface)
	row := claimRow{Path: path}
	for key, into := range map[string]*string{
		"Id": &row.ID, "Device": &row.Device, "Netns": &row.Netns,
		"InterfaceName": &row.Ifname, "Owner": &row.Owner,
	} {
		*into, _ = p[key].Value().(string)
	}
	return row, err
}

// detach gives back what a claim Hold made took and holds it for its pod again (the pod's
// next sandbox attaches it); false when it had ended (DEL is idempotent).
func (r *rdmad) detach(claimID string) (bool, error) {
	err := r.call(rootPath, manager+".Detach", nil, claimID)
	var cerr *types.Error
	if errors.As(err, &cerr) && cerr.Code == codeNoSuchClaim {
		return false, nil
	}
	return err == nil, err
}

// release ends a claim; false when it had already ended (DEL is idempotent).
func (r *rdmad) release(claimID string) (bool, error) {
	err := r.call(rootPath, manager+".Release", nil, claimID)
	var cerr *types.Error
	if errors.As(err, &cerr) && cerr.Code == codeNoSuchClaim {
		return false, nil
	}
	return err == nil, err
}
