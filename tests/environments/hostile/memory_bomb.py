"""Attack: allocate and touch 8 GiB of memory.

Expected containment: oom -- RLIMIT_AS makes the allocation fail with MemoryError long
before the machine feels it.
"""

import json
import sys

CTX = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}


def attempt(what, fn):
    """Run one attack step: an exception means it was blocked, a return value means it escaped."""
    try:
        got = fn()
    except BaseException as err:  # noqa: BLE001
        print(f"BLOCKED {what}: {type(err).__name__}: {err}"[:300], flush=True)
        return None
    print(f"ESCAPED {what}: {got!r}"[:300], flush=True)
    return got


chunks = []
for _ in range(64):
    chunks.append(bytearray(128 * 1024 * 1024))
print("ESCAPED allocated 8 GiB")
