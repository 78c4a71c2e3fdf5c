"""Attack: daemonize (double fork + setsid, closing the output pipes) so a grandchild
survives the run, then keep trying to write to the host canary dir for a minute. The main
process exits only after the daemon's first write attempt (a pipe), so whether that write lands
depends on the sandbox alone, not on which process the scheduler runs first.

Expected containment: reaped -- the run returns when the main process exits; the pid
namespace dies with its init and the uid sweep kills the rest, so no process of the sandbox
uid remains and nothing is written.
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
import time

first_try_r, first_try_w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.close(first_try_r)
        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        for attempt_no in range(600):
            try:
                open(os.path.join(CTX.get("canary_dir", "/nonexistent"), "daemon-was-here"), "w").close()
            except OSError:
                pass
            if attempt_no == 0:
                os.write(first_try_w, b"x")
                os.close(first_try_w)
            time.sleep(0.1)
        os._exit(0)
    os._exit(0)
os.close(first_try_w)
os.wait()
os.read(first_try_r, 1)  # b"" if the daemon died first
print("DAEMONIZED", flush=True)
