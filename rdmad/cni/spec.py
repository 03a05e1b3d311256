"""The CNI spec's shapes: versions, error codes, and results per version."""

from __future__ import annotations

from typing import Any

SUPPORTED_VERSIONS = ("0.4.0", "1.0.0", "1.1.0")
LATEST = "1.1.0"

# Error codes of the CNI spec (1.1.0, "Error" section); 100 and up are the plugin's own.
INCOMPATIBLE_VERSION = 1
UNSUPPORTED_FIELD = 2
CONTAINER_UNKNOWN = 3
INVALID_ENV = 4
IO_FAILURE = 5
DECODE_FAILURE = 6
INVALID_CONFIG = 7
TRY_AGAIN_LATER = 11
NOT_AVAILABLE = 50  # STATUS: the plugin cannot serve ADDs now
RDMAD_FAILED = 100


class CniError(Exception):
    """A failure the runtime sees as the spec's error object and a non-zero exit."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details

    def to_json(self, version: str) -> dict[str, Any]:
        out: dict[str, Any] = {"cniVersion": version, "code": self.code, "msg": self.msg}
        if self.details:
            out["details"] = self.details
        return out


def shape_result(result: dict[str, Any], version: str) -> dict[str, Any]:
    """A result (built in the 1.x shape) in the shape `version` asks for.

    0.4.0 differs in one field: each IP carries "version" ("4" or "6").
    """
    out = dict(result, cniVersion=version)
    if version == "0.4.0":
        out["ips"] = [
            dict(ip, version="6" if ":" in ip["address"] else "4") for ip in result.get("ips", [])
        ]
    else:
        out["ips"] = [
            {k: v for k, v in ip.items() if k != "version"} for ip in result.get("ips", [])
        ]
    return out


def version_info() -> dict[str, Any]:
    return {"cniVersion": LATEST, "supportedVersions": list(SUPPORTED_VERSIONS)}
