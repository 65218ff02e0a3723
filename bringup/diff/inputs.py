"""Reading one image's artifact folder for the diff, with errors that name the file.

Which stage writes which file is stated once here (``MADE_BY``), so a missing file can be
reported together with the command that makes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV, BUILD, VERIFY, AB_MANIFEST, AB_RESULTS, E2E_REPORT, E2E_TOKENS, REPLAY_REPORT = (
    "env.json", "build.json", "verify.json", "ab/manifest.json", "ab/results.json", "e2e/report.json", "e2e/tokens.jsonl",
    "replay/report.json")

MADE_BY = {ENV: "env", BUILD: "build", VERIFY: "verify", AB_MANIFEST: "ab", AB_RESULTS: "ab", E2E_REPORT: "e2e", E2E_TOKENS: "e2e",
           REPLAY_REPORT: "replay"}
# Only images with a peer engine have it (stage peer), and only images blamed have a blame report
# (stage blame, or invoke diff --blame), so neither is ever reported missing.
PEER_REPORT = "peer/report.json"
BLAME_REPORT = "blame/report.json"


class UnusableInput(Exception):
    """An artifact exists but cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class Missing:
    """An artifact a compared image lacks, with the stage that makes it."""

    image: str
    file: str
    stage: str
    reference: str = ""  # for a stage that compares with the reference image (replay)

    def message(self, artifacts: Path) -> str:
        if self.stage == "all":
            return f"{self.image}: no artifacts folder {artifacts / self.image} (make it: invoke all --image {self.image})"
        against = f" --reference {self.reference}" if self.reference else ""
        return (f"{self.image}: lacks {artifacts / self.image / self.file} "
                f"(made by stage {self.stage}: invoke {self.stage} --image {self.image}{against})")


@dataclass(frozen=True)
class ImageArtifacts:
    """The artifact folder of one image (``root`` = ``<artifacts>/<image>``)."""

    name: str
    root: Path

    def exists(self) -> bool:
        return self.root.is_dir()

    def has(self, rel: str) -> bool:
        return (self.root / rel).is_file()

    def path(self, rel: str) -> Path:
        return self.root / rel

    def json(self, rel: str) -> dict[str, Any]:
        """A JSON object artifact; UnusableInput when it is unreadable or not an object."""
        path = self.root / rel
        try:
            value = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UnusableInput(f"{path}: not a readable JSON file ({exc})") from None
        if not isinstance(value, dict):
            raise UnusableInput(f"{path}: expected a JSON object, got {type(value).__name__}")
        return value

    def json_or_none(self, rel: str) -> dict[str, Any] | None:
        return self.json(rel) if self.has(rel) else None

    def backend_dumps(self) -> dict[str, Path]:
        """The A/B dumps of the backends other than the default one: ``ab/<backend>/`` folders
        with a manifest (the ab stage writes one per backend available in the image)."""
        ab = self.root / "ab"
        if not ab.is_dir():
            return {}
        return {p.name: p for p in sorted(ab.iterdir())
                if p.is_dir() and not p.name.startswith(".") and (p / "manifest.json").is_file()}
