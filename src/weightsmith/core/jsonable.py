"""One conversion to JSON-ready values, shared by every result file weightsmith writes."""

from __future__ import annotations

import dataclasses
import math
from typing import Any


def jsonable(obj: Any) -> Any:
    """`obj` as plain JSON values, so `json.dumps(..., allow_nan=False)` accepts it.

    Dataclass instances become dicts of their fields, recursively; dict keys become strings;
    tuples become lists (JSON has no tuple); infinities and NaN become null (JSON has neither).
    Anything else is returned unchanged.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
