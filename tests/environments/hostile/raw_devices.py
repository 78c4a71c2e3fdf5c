"""Attack: open raw devices: the host disk (/dev/vda, /dev/sda, /dev/nvme0n1), /dev/mem,
/dev/kmsg, /dev/tty, /dev/fuse.

Expected containment: blocked -- the sandbox /dev only has null, zero, full, random,
urandom (ENOENT for everything else).
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


for path in ("/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/mem", "/dev/kmsg", "/dev/tty", "/dev/fuse"):
    attempt(f"open {path}", lambda p=path: open(p, "rb").read(16))
