"""Run a snapshot through the real `dnnctl doctor --from` (human at 80 columns and --json)."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from dnnctl.cli.app import app
from dnnctl.cli.render import split_commands


@dataclass
class Doctor:
    code: int  # exit status of the human run
    text: str  # the human report
    data: dict[str, Any]  # the --json document

    @property
    def findings(self) -> list[dict[str, Any]]:
        return self.data["findings"]

    def codes(self, component: str | None = None, *, info: bool = False) -> set[str]:
        """The codes of errors and warnings (and info with ``info``), of one component."""
        return {f["code"] for f in self.findings
                if (component is None or f["component"] == component)
                and (info or f["severity"] != "info")}

    def of(self, code: str, component: str | None = None) -> list[dict[str, Any]]:
        return [f for f in self.findings if f["code"] == code
                and (component is None or f["component"] == component)]

    @property
    def fixes(self) -> str:
        return " | ".join(f["fix"] or "" for f in self.findings)


def doctor(tmp_path: Path, text: str) -> Doctor:
    """Judge the snapshot ``text``; the human report must fit 80 columns and agree with the
    JSON verdict."""
    snap = tmp_path / "env.yaml"
    snap.write_text(text if text.startswith("schema:") else "schema: dnnctl-env/1\n" + text)
    runner = CliRunner()
    human = runner.invoke(app, ["doctor", "--from", str(snap)], env={"COLUMNS": "80"})
    result = runner.invoke(app, ["doctor", "--from", str(snap), "--json"])
    data = json.loads(result.stdout)
    assert data["schema"] == "dnnctl-doctor/1"
    width = max(len(line.rstrip()) for line in human.output.splitlines())
    assert width <= 80, human.output
    fixes = [f["fix"] for f in data["findings"] if f.get("fix")]
    assert sorted(shown_commands(human.output)) == sorted(
        c for fix in fixes for c in split_commands(fix)[1]), human.output
    assert (human.exit_code == 1) == (data["verdict"] == "fail"), human.output
    return Doctor(human.exit_code, human.output, data)


def shown_commands(text: str) -> list[str]:
    """The commands of a human report as the shell reads them: the lines under each
    ``# [n]`` joined back (`` \\`` ends a line between words, a bare ``\\`` inside one)."""
    lines = text.splitlines()
    if "commands (one per line):" not in lines:
        return []
    out: list[str] = []
    for line in lines[lines.index("commands (one per line):") + 1:]:
        line = line.rstrip()
        if line.startswith("# ["):
            out.append("")
        elif not out or not line or line.startswith(("probe notes:", "  · ", "snapshot saved")):
            break
        elif out[-1].endswith(" \\"):
            out[-1] = out[-1][:-1] + line.lstrip()
        elif out[-1].endswith("\\"):
            out[-1] = out[-1][:-1] + line
        else:
            out[-1] += line
    return out


def probe_fakes() -> Any:
    """tests/data/probes/fakes.py (stand-in libraries and tools for the probes), loaded once
    as the module ``dnnctl_probe_fakes``."""
    if "dnnctl_probe_fakes" not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "data" / "probes" / "fakes.py"
        spec = importlib.util.spec_from_file_location("dnnctl_probe_fakes", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    return sys.modules["dnnctl_probe_fakes"]
