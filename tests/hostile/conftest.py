"""The hostile-input corpus: every case builds its own bad input (see harness.py for what is asserted).

The corpus reuses the doctor's checkpoint builders (tests/audit/doctor_builders.py).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "audit"))

from hostile.harness import sandbox  # noqa: F401  (a fixture)
