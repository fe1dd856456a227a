"""Shared fixtures: the tests directory is importable for the synthetic checkpoint helpers."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
