"""The hostile-input corpus: every case builds its own bad input (see harness.py for what is asserted)."""

from hostile.harness import sandbox  # noqa: F401  (a fixture)
