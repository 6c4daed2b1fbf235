"""The project's state folder: where every command and flow keeps its outputs unless told otherwise."""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    """The project's state folder: $PGT_STATE_DIR, else .state under the current directory."""
    return Path(os.environ.get("PGT_STATE_DIR") or Path.cwd() / ".state").resolve()
