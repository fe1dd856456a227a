"""The one severity scale of the project: verify's findings and bench's log evidence both use it.

An error is something that makes the result wrong or unusable (verify exits 1, `bench logcheck`
exits 1); a warning is tolerated but worth a look; info is reported for the record.
"""

from __future__ import annotations

from typing import Literal

Severity = Literal["error", "warning", "info"]

ERROR: Severity = "error"
WARNING: Severity = "warning"
INFO: Severity = "info"

#: Most severe first: the order findings and evidence are listed in.
SEVERITY_ORDER: dict[str, int] = {ERROR: 0, WARNING: 1, INFO: 2}
