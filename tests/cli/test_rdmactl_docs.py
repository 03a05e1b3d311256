"""docs/dbus-api.md's rdmactl section against the code it describes: the exit status table is
a copy of rdmad/cli/exitcodes.py's, and every command has its --json shape there."""

from __future__ import annotations

from pathlib import Path

from rdmad.cli.exitcodes import MEANINGS, Exit
from rdmad.cli.main import COMMANDS, EPILOG

DOC = Path(__file__).resolve().parents[2] / "docs" / "dbus-api.md"


def markdown_table(header: str) -> list[list[str]]:
    """The rows of the table under the line `header`, each cell as text: without backticks,
    with `\\|` read as |."""
    lines = DOC.read_text().splitlines()
    start = lines.index(header) + 2  # past the |---| line
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = line.strip("|").replace("\\|", "\0").split("|")
        rows.append([c.replace("\0", "|").replace("`", "").strip() for c in cells])
    return rows


def test_the_docs_exit_status_table_is_the_codes() -> None:
    documented = markdown_table("| exit | meaning | stderr |")
    assert documented == [
        [str(status.value), MEANINGS[status].text, MEANINGS[status].stderr] for status in Exit
    ]


def test_help_ends_with_every_exit_status() -> None:
    for status in Exit:
        assert f"\n  {status.value:<5}{MEANINGS[status].text.split()[0]}" in EPILOG


def test_the_docs_give_every_commands_json_shape() -> None:
    documented = [row[0] for row in markdown_table("| Command | `--json` output |")]
    assert sorted(documented) == sorted(COMMANDS)
