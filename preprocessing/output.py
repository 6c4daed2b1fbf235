"""The output folder of `pgt preprocess`, recognised by its manifest.

`check_output_folder(out_dir)` refuses a folder that `pgt preprocess` did not write, or one that also holds files
it did not write: nothing of the user's is ever replaced or deleted, `--force` included. The folder is then written
by `infra.output.write_folder` under `infra.output.output_lock`.
"""

from __future__ import annotations

import json
from pathlib import Path

from infra.errors import InputError

PRODUCER = "pgt preprocess"  # the manifest's `producer`: the folder is this program's output
LEGACY_KEYS = ("input_sha256", "input_format", "config", "version", "counts")  # manifests written before the marker


def read_manifest(out_dir: Path) -> dict | None:
    """The folder's manifest.json as a dict, None if there is none; InputError if it is not a JSON object."""
    path = Path(out_dir) / "manifest.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(path, f"corrupt manifest, not JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise InputError(path, f"corrupt manifest: expected a JSON object, found {type(data).__name__}")
    return data


def is_own_manifest(manifest: dict | None) -> bool:
    """Whether a manifest was written by `pgt preprocess` (the producer marker, or an older one's keys)."""
    if not manifest:
        return False
    return manifest.get("producer") == PRODUCER or all(key in manifest for key in LEGACY_KEYS)


def check_output_folder(out_dir: Path, own_files: tuple[str, ...]) -> None:
    """Refuse (InputError, exit 2) an --out that is a file, or a non-empty folder that is not wholly
    `pgt preprocess` output: one without our manifest, or one that also holds files we did not write."""
    out_dir = Path(out_dir)
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise InputError(out_dir, "exists and is not a folder; choose another --out")
    entries = sorted(p.name for p in out_dir.iterdir())
    if not entries:
        return
    try:
        manifest = read_manifest(out_dir)
    except InputError:
        manifest = None
    if not is_own_manifest(manifest):
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        raise InputError(out_dir, f"holds files that `pgt preprocess` did not write ({shown}); "
                                  "nothing there is replaced: choose another --out")
    foreign = [name for name in entries if name not in own_files]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise InputError(out_dir, f"also holds files that `pgt preprocess` did not write ({shown}); they would be "
                                  "lost when the folder is replaced: move them out or choose another --out")
