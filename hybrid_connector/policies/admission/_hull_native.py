"""Optional native build of the placement DP's hull loop (same algorithm as ``_dp_python``).

The C source below is compiled once with the system C compiler into a per-user cache
directory and loaded with ctypes; when no compiler is available (or the build fails)
``load()`` returns ``None`` and callers use the pure-Python loop. Float64 arithmetic only.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

_SRC = r"""
#include <stdint.h>
/* Exact O(K*M) hull DP; see hybrid_connector/policies/admission/placement.py for the recurrence.
   args is M x (K+1); returns f_M(K). Scratch buffers are caller-provided. */
double hull_dp(int64_t k, int64_t m, const double *depth, const double *w, int64_t *args,
               double *P, double *Q, double *slope, double *fp, double *f,
               double *hk, double *hb, int64_t *hi) {
    P[0] = 0; Q[0] = 0;
    for (int64_t i = 0; i < k; i++) { P[i+1] = P[i] + w[i]; Q[i+1] = Q[i] + depth[i] * w[i]; }
    for (int64_t i = 0; i < k; i++) slope[i] = -depth[i];
    slope[k] = -(depth[k-1] + 1);
    for (int64_t i = 0; i <= k; i++) fp[i] = Q[i];
    for (int64_t layer = 0; layer < m; layer++) {
        int64_t *arg = args + layer * (k + 1);
        int64_t top = -1, head = 0;
        for (int64_t e = 0; e <= k; e++) {
            double sk = slope[e], x = P[e];
            double sb = fp[e] - Q[e] - sk * x;
            while (top > head) {
                double k1 = hk[top-1], b1 = hb[top-1];
                if ((sb - b1) * (k1 - hk[top]) <= (hb[top] - b1) * (k1 - sk)) top--;
                else break;
            }
            top++; hk[top] = sk; hb[top] = sb; hi[top] = e;
            if (head > top) head = top;
            double cur = hk[head] * x + hb[head];
            while (head < top) {
                double nxt = hk[head+1] * x + hb[head+1];
                if (nxt <= cur) { head++; cur = nxt; } else break;
            }
            f[e] = Q[e] + cur; arg[e] = hi[head];
        }
        for (int64_t i = 0; i <= k; i++) fp[i] = f[i];
    }
    return fp[k];
}
"""

_lib: ctypes.CDLL | None = None
_tried = False


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hybrid_connector"


def load() -> ctypes.CDLL | None:
    """The compiled library, building it on first use; ``None`` when it cannot be built."""
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    if os.environ.get("HYBRID_CONNECTOR_NO_NATIVE"):
        return None
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    tag = hashlib.sha256(_SRC.encode()).hexdigest()[:16]
    out = _cache_dir() / f"hull_dp_{tag}.so"
    try:
        if not out.exists():
            if cc is None:
                return None
            out.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory() as tmp:
                src = Path(tmp) / "hull_dp.c"
                src.write_text(_SRC)
                so = Path(tmp) / "hull_dp.so"
                subprocess.run([cc, "-O2", "-shared", "-fPIC", str(src), "-o", str(so)],
                               check=True, capture_output=True, timeout=60)
                os.replace(so, out)  # atomic: concurrent builders never load a partial file
        lib = ctypes.CDLL(str(out))
    except (OSError, subprocess.SubprocessError):
        return None
    lib.hull_dp.restype = ctypes.c_double
    lib.hull_dp.argtypes = [ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 11
    _lib = lib
    return lib


def hull_dp(depths: np.ndarray, weights: np.ndarray, m: int) -> tuple[float, np.ndarray] | None:
    """Run the native DP: (f_M(K), args M x (K+1)) or ``None`` when unavailable. Called for
    tiny problems (K ~ 10) many times: two allocations, the inputs copied into the first."""
    lib = load()
    if lib is None:
        return None
    k = int(depths.size)
    n = k + 1
    # float64: depth, w, then the seven scratch rows P, Q, slope, fp, f, hk, hb (n each)
    fl = np.empty(9 * n, dtype=np.float64)
    fl[:k] = depths
    fl[n:n + k] = weights
    ints = np.zeros((m + 1) * n, dtype=np.int64)  # args (m x n), then the scratch row hi
    fp, ip, s = fl.ctypes.data, ints.ctypes.data, 8 * n
    cost = lib.hull_dp(k, m, fp, fp + s, ip, *(fp + r * s for r in range(2, 9)), ip + m * s)
    return float(cost), ints[:m * n].reshape(m, n)
