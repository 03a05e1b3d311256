"""rdmad-cni's entry point: the environment and stdin in, the spec's JSON out."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO

from rdmad.cni import verbs
from rdmad.cni.config import decode, parse_env, parse_netconf
from rdmad.cni.spec import LATEST, SUPPORTED_VERSIONS, CniError, shape_result, version_info


def run(environ: dict[str, str], stdin: bytes, out: TextIO) -> int:
    """One plugin invocation; the process exit code."""
    version = _requested_version(stdin)
    try:
        env = parse_env(environ)
        if env.command == "VERSION":
            _emit(out, version_info())
            return 0
        conf = parse_netconf(stdin, env.command)
        if env.command == "ADD":
            _emit(out, shape_result(verbs.add(env, conf, environ), conf.version))
        elif env.command == "DEL":
            verbs.delete(env, conf, environ)
        elif env.command == "CHECK":
            verbs.check(env, conf, environ)
        elif env.command == "GC":
            verbs.gc(env, conf, environ)
        else:
            verbs.status(conf)
    except CniError as exc:
        _emit(out, exc.to_json(version))
        return 1
    return 0


def _requested_version(stdin: bytes) -> str:
    """The config's cniVersion for shaping an error, when it is one we speak."""
    try:
        wanted = decode(stdin).get("cniVersion")
    except CniError:
        return LATEST
    return wanted if wanted in SUPPORTED_VERSIONS else LATEST


def _emit(out: TextIO, doc: dict[str, Any]) -> None:
    json.dump(doc, out)
    out.write("\n")


def main() -> None:
    sys.exit(run(dict(os.environ), sys.stdin.buffer.read(), sys.stdout))


if __name__ == "__main__":
    main()
