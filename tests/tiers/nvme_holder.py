"""A second process holding an NVMe tier: ``python nvme_holder.py DIR N`` opens ``NvmeTier(DIR)``,
stores N objects (``make_key(i)`` -> ``make_payload(i)``, every put acknowledged), prints
``ready <pid>`` and keeps the tier open until stdin closes (or it is killed)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tier_helpers import make_key, make_payload  # noqa: E402

from hybrid_connector.core.keys import ObjectKind  # noqa: E402
from hybrid_connector.tiers.nvme import NvmeTier  # noqa: E402

BUDGET = {k: 64 << 20 for k in ObjectKind}
SHAPE = (256, 512)  # 512 KiB each: 120 of them overflow a 32 MiB budget


def main() -> None:
    path, n = sys.argv[1], int(sys.argv[2])
    tier = NvmeTier(path, BUDGET)
    for i in range(n):
        assert tier.put([(make_key(i), make_payload(i, SHAPE))]) == [True]
    print(f"ready {os.getpid()}", flush=True)
    sys.stdin.read()  # until the test closes our stdin
    tier.close()


if __name__ == "__main__":
    main()
