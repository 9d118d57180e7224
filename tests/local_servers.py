"""The body of the session fixtures that run a local server (:mod:`kbp_local`)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def served(server: Any, work: Path) -> Iterator[Any]:
    """Start ``server`` (its data in ``work``), yield it, then stop it and delete ``work``."""
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
