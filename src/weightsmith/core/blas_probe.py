"""Keep numba from importing `scipy.linalg` only to learn whether a BLAS is there.

When numba first loads a kernel (compiled or from its cache) it imports `numba.np.arraymath`, which
at import calls `_check_blas()`: `import scipy.linalg.cython_blas`. Importing `scipy.linalg` costs
0.2-0.4 s of CPU, a fifth of a one-second quantize, and the answer is used in one place only:
`np.correlate` and `np.convolve` inside a numba kernel call BLAS when it is there and a loop
otherwise. No weightsmith kernel calls either, nor any BLAS function (those check for BLAS again
when compiled, and would import scipy then). So for the commands that run kernels, the probe is
answered "no BLAS" without the import.

The finder refuses `scipy.linalg` only while `numba.np.arraymath` is executing (the module exists
and has not yet assigned `_HAVE_BLAS`), so any other import of scipy.linalg, before or after, is
untouched. Should numba move its probe, the finder simply never fires and the import happens as before.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

#: The module whose import-time probe is answered, and the name it assigns the answer to.
PROBING_MODULE, ANSWER = "numba.np.arraymath", "_HAVE_BLAS"
PROBED = "scipy.linalg"


class _NoBlasProbe(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == PROBED:
            probing = sys.modules.get(PROBING_MODULE)
            if probing is not None and not hasattr(probing, ANSWER):
                raise ModuleNotFoundError(f"{PROBED} is not imported for numba's BLAS probe", name=fullname)
        return None


def skip() -> None:
    """Answer numba's BLAS probe "no BLAS" in this process, unless numba or scipy.linalg already loaded."""
    if PROBING_MODULE in sys.modules or PROBED in sys.modules:
        return
    if not any(isinstance(f, _NoBlasProbe) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoBlasProbe())
