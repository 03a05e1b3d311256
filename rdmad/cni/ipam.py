"""IPAM delegation: run the plugin the config's `ipam.type` names from CNI_PATH, with the
same environment and config, as the macvlan and host-device plugins do."""

from __future__ import annotations

import json
import os
from typing import Any

from rdmad.cni.config import Env, NetConf
from rdmad.cni.spec import INVALID_CONFIG, INVALID_ENV, IO_FAILURE, CniError


def find_plugin(kind: str, path: tuple[str, ...]) -> str:
    if not path:
        raise CniError(INVALID_ENV, f"CNI_PATH is empty: cannot find the IPAM plugin {kind!r}")
    for directory in path:
        candidate = os.path.join(directory, kind)
        if os.access(candidate, os.X_OK) and os.path.isfile(candidate):
            return candidate
    raise CniError(INVALID_CONFIG, f"IPAM plugin {kind!r} not found in CNI_PATH", ":".join(path))


def run(verb: str, env: Env, conf: NetConf, environ: dict[str, str]) -> dict[str, Any] | None:
    """Run the IPAM plugin's `verb`; its result (ADD) or None. Its own error passes through
    with its code."""
    plugin = find_plugin(conf.ipam_type, env.path)
    # Imported here: subprocess is a large part of a plugin run's start, and configs
    # without IPAM never need it.
    import subprocess

    try:
        done = subprocess.run(
            [plugin],
            input=conf.raw,
            env={**environ, "CNI_COMMAND": verb},
            capture_output=True,
            check=False,
        )
    except OSError as exc:
        raise CniError(IO_FAILURE, f"cannot run IPAM plugin {plugin}", str(exc)) from None
    if done.returncode != 0:
        try:
            err = json.loads(done.stdout)
            raise CniError(
                int(err["code"]), f"IPAM {conf.ipam_type}: {err['msg']}", err.get("details", "")
            )
        except (ValueError, KeyError, TypeError):
            text = (done.stdout + done.stderr).decode(errors="replace").strip()
            raise CniError(IO_FAILURE, f"IPAM {conf.ipam_type} failed", text) from None
    if verb != "ADD":
        return None
    try:
        result = json.loads(done.stdout)
    except ValueError:
        raise CniError(IO_FAILURE, f"IPAM {conf.ipam_type} returned no JSON result") from None
    if not isinstance(result, dict):
        raise CniError(IO_FAILURE, f"IPAM {conf.ipam_type} returned no JSON object")
    return result
