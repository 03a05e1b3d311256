// rdmad-cni: a CNI plugin (type "rdmad") that turns a runtime's ADD/DEL into rdmad claims.
//
// Written in Go, like the reference plugins: a plugin run is a process start on every pod
// start and stop, and CPython's start and imports alone took longer than the ADD's budget.
package main

import (
	"errors"
	"io"
	"os"
	"strings"
)

// run is one plugin invocation: the environment and stdin in, the spec's JSON out; the
// process exit code.
func run(environ map[string]string, stdin []byte, out io.Writer) int {
	version := requestedVersion(stdin)
	err := dispatch(environ, stdin, out)
	if err == nil {
		return 0
	}
	var cerr *cniError
	if !errors.As(err, &cerr) {
		cerr = newError(codeRdmadFailed, err.Error())
	}
	emit(out, cerr.document(version))
	return 1
}

func dispatch(environ map[string]string, stdin []byte, out io.Writer) error {
	e, err := parseEnv(environ)
	if err != nil {
		return err
	}
	if e.Command == "VERSION" {
		emit(out, versionInfo())
		return nil
	}
	conf, err := parseNetconf(stdin, e.Command)
	if err != nil {
		return err
	}
	if conf.Pod && e.Command == "ADD" {
		result, err := podAdd(e, conf, environ)
		if err == nil {
			emit(out, shapeResult(result, conf.Version))
		}
		return err
	}
	if conf.Pod && e.Command == "DEL" {
		return podDel(e, conf, environ)
	}
	if conf.Pod && e.Command == "CHECK" {
		return nil // the attached claims are the pod's netns's: rdmad ends them with it
	}
	switch e.Command {
	case "ADD":
		result, err := add(e, conf, environ)
		if err == nil {
			emit(out, shapeResult(result, conf.Version))
		}
		return err
	case "DEL":
		return del(e, conf, environ)
	case "CHECK":
		if !atLeast(conf.Version, "0.4.0") {
			return newError(codeIncompatibleVersion, "cniVersion "+conf.Version+" has no CHECK (0.4.0 and later)")
		}
		return check(e, conf, environ)
	case "GC":
		return gc(e, conf, environ)
	default:
		return status(e, conf, environ)
	}
}

func main() {
	environ := map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			environ[k] = v
		}
	}
	stdin, err := io.ReadAll(os.Stdin)
	if err != nil {
		emit(os.Stdout, newError(codeIOFailure, "cannot read the configuration", err.Error()).document(latestVersion))
		os.Exit(1)
	}
	os.Exit(run(environ, stdin, os.Stdout))
}
