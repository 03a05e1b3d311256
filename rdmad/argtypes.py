"""argparse types shared by rdmad's command-line tools (rdmactl, rdmad-exporter)."""

from __future__ import annotations

import argparse


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value
