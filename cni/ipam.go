package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// IPAM delegation: run the plugin the config's ipam.type names from CNI_PATH, with the
// same environment and config, as the macvlan and host-device plugins do.

func findPlugin(kind string, path []string) (string, error) {
	if len(path) == 0 {
		return "", newError(codeInvalidEnv, fmt.Sprintf("CNI_PATH is empty: cannot find the IPAM plugin %q", kind))
	}
	for _, dir := range path {
		candidate := filepath.Join(dir, kind)
		if info, err := os.Stat(candidate); err == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0 {
			return candidate, nil
		}
	}
	return "", newError(codeInvalidConfig, fmt.Sprintf("IPAM plugin %q not found in CNI_PATH", kind),
		strings.Join(path, ":"))
}

// runIPAM runs the IPAM plugin's verb with environ (CNI_COMMAND replaced); its result
// (ADD) or nil. Its own error passes through with its code.
func runIPAM(verb string, e *env, conf *netConf, environ map[string]string) (map[string]any, error) {
	plugin, err := findPlugin(conf.IPAMType, e.Path)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(plugin)
	cmd.Stdin = bytes.NewReader(conf.Raw)
	var stdout, stderr bytes.Buffer
	// Its stderr is ours too (the spec's delegation procedure): the runtime logs it.
	cmd.Stdout, cmd.Stderr = &stdout, io.MultiWriter(&stderr, os.Stderr)
	for k, v := range environ {
		if k != "CNI_COMMAND" {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	cmd.Env = append(cmd.Env, "CNI_COMMAND="+verb)
	runErr := cmd.Run()
	var exit *exec.ExitError
	if runErr != nil && !errors.As(runErr, &exit) {
		return nil, newError(codeIOFailure, "cannot run IPAM plugin "+plugin, runErr.Error())
	}
	if runErr != nil {
		var reported struct {
			Code    *int   `json:"code"`
			Msg     string `json:"msg"`
			Details string `json:"details"`
		}
		if json.Unmarshal(stdout.Bytes(), &reported) == nil && reported.Code != nil {
			return nil, newError(*reported.Code, fmt.Sprintf("IPAM %s: %s", conf.IPAMType, reported.Msg), reported.Details)
		}
		text := strings.TrimSpace(stdout.String() + stderr.String())
		return nil, newError(codeIOFailure, fmt.Sprintf("IPAM %s failed", conf.IPAMType), text)
	}
	if verb != "ADD" {
		return nil, nil
	}
	result, err := jsonObject(stdout.Bytes())
	if err != nil {
		return nil, newError(codeIOFailure, fmt.Sprintf("IPAM %s returned no JSON result", conf.IPAMType), err.Error())
	}
	return result, nil
}
