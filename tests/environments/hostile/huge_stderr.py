"""Attack: write gigabytes to stderr (unbuffered, straight to the fd).

Expected containment: truncated -- the parent keeps max_output_bytes and kills the run.
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


import os

block = b"E" * 65536
for _ in range(100_000):
    os.write(2, block)
