"""Sizes in configs: ``5GB`` (10^9), ``512MiB`` (2^20), ``1.5 GiB`` or a bare number."""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BeforeValidator

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
MAX_SIZE = 2**50  # 1 PiB: no pool of one process is larger; a bigger figure is a unit mistake


def parse_size(value: object, bare_unit: int = 1) -> int:
    """Bytes from ``5GB``/``512MiB``/a number (a bare number is multiplied by ``bare_unit``).

    Raises ValueError for anything that is not a finite size in ``[0, MAX_SIZE]`` bytes
    (booleans, inf, nan, negative numbers, unknown units, more than 1 PiB)."""
    n: int | float
    if isinstance(value, bool):
        raise ValueError(f"expected a size, got {value!r}")
    if isinstance(value, int | float):
        n = value * bare_unit
    elif isinstance(value, str) and (m := _SIZE_RE.match(value)) and m.group(2).lower() in _UNITS:
        n = float(m.group(1)) * (_UNITS[m.group(2).lower()] if m.group(2) else bare_unit)
    else:
        raise ValueError(f"expected a size such as '5GB' or '512MiB', got {value!r}")
    if isinstance(n, float) and not math.isfinite(n):
        raise ValueError(f"size must be finite, got {value!r}")
    if n < 0:
        raise ValueError(f"size must be >= 0, got {value!r}")
    if n > MAX_SIZE:
        hint = " (a bare number here means GB)" if bare_unit != 1 else ""
        raise ValueError(f"size {value!r} = {float(n):.3g} B is above the 1 PiB limit{hint}")
    return int(n)


Bytes = Annotated[int, BeforeValidator(lambda v: parse_size(v))]
