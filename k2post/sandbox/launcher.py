"""Child side of the sandbox: namespaces, mounts, rlimits, uid drop, seccomp, then exec.

Run by `k2post.sandbox.runner` as `python -I -S launcher.py SPEC_JSON` in a new session,
as root, with a minimal environment (stdlib only: no venv, no pydantic). Process tree:

    launcher (root, outside the namespaces; builds the mount tree)
      └─ init (root; pid 1 of the new pid namespace, or a child subreaper without one)
           └─ payload (the sandbox uid, rlimits, chroot, seccomp) ── exec ──> program

The launcher outlives nobody: when its parent dies (PR_SET_PDEATHSIG -> SIGUSR1) or its own
deadline passes (wall_s + grace, SIGALRM) it kills init, sweeps the sandbox uid and removes
the temp tree (from the host mount namespace); init dies with the launcher
(PR_SET_PDEATHSIG -> SIGKILL), which ends the pid namespace.

Events go to the parent as JSON lines on the status fd (never visible to the payload):
`{"event": "ready", "isolation": [...]}`, `{"event": "exit", "status": raw, "cpu_s": x}`,
`{"event": "error", "message": ...}`. Other modes: `--probe DIR` prints which kernel
features work here; `--sweep UID GID` SIGKILLs every process of UID.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import shutil
import signal
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seccomp  # noqa: E402  (stdlib-only sibling module, loaded by path)

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
SANDBOX_NS = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
DEVICES = ("null", "zero", "full", "random", "urandom")
ETC_FILES = ("ld.so.cache", "localtime")

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(RuntimeError):
    """The sandbox could not be built as the spec asks."""


ABORT_SIGNALS = (signal.SIGALRM, signal.SIGUSR1)


class Abort(Exception):
    """The launcher's own deadline passed (SIGALRM) or its parent died (SIGUSR1)."""


def _abort(signum: int, frame: Any) -> None:
    raise Abort(signal.Signals(signum).name)


def die_with_parent(parent: int | None, sig: int) -> None:
    """Get `sig` when the parent dies; exit now if it already has."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0), "prctl(PDEATHSIG)")
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)} (errno {err})")


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), f"unshare({flags:#x})")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    ret = _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(ret, f"mount {source} on {target}")


def emit(fd: int, **event: Any) -> None:
    """One JSON line on the status pipe (atomic: well under PIPE_BUF)."""
    try:
        os.write(fd, (json.dumps(event)[:3000] + "\n").encode())
    except OSError:
        pass


# ---------------------------------------------------------------- mount tree (namespace mode)


def bind(source: str, target: str, flags: int) -> None:
    """Bind `source` on `target`, then remount the bind with `flags` (e.g. read-only)."""
    mount(source, target, None, MS_BIND)
    mount(None, target, None, MS_BIND | MS_REMOUNT | flags)


def make_box(tmp: str, spec: dict[str, Any]) -> str:
    """The size-capped tmpfs holding work/, tmp/ and shm/, owned by the sandbox uid."""
    box = os.path.join(tmp, "box")
    os.mkdir(box, 0o755)
    opts = f"size={spec['disk_mb']}m,nr_inodes={spec['max_inodes']},mode=0755"
    mount("tmpfs", box, "tmpfs", MS_NOSUID | MS_NODEV, opts)
    for sub in ("work", "tmp", "shm"):
        os.mkdir(os.path.join(box, sub), 0o700)
        chown(os.path.join(box, sub), spec)
    return box


def chown(path: str, spec: dict[str, Any]) -> None:
    if spec.get("uid") is not None:
        os.lchown(path, spec["uid"], spec["gid"])


def copy_files(src: str, dst: str, spec: dict[str, Any]) -> None:
    """Copy the program's files into the work dir and give them to the sandbox uid."""
    for dirpath, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        out = os.path.normpath(os.path.join(dst, rel))
        os.makedirs(out, 0o700, exist_ok=True)
        chown(out, spec)
        for name in filenames:
            shutil.copyfile(os.path.join(dirpath, name), os.path.join(out, name), follow_symlinks=False)
            chown(os.path.join(out, name), spec)


def link_system(root: str, extra: list[str]) -> None:
    """Read-only binds of the system dirs (symlinks copied as symlinks) and `extra` dirs."""
    ro = MS_RDONLY | MS_NOSUID | MS_NODEV
    for path in SYSTEM_DIRS:
        target = root + path
        if os.path.islink(path):
            os.symlink(os.readlink(path), target)
        elif os.path.isdir(path):
            os.mkdir(target, 0o755)
            bind(path, target, ro)
    for path in extra:
        if not any(path == d or path.startswith(d + "/") for d in SYSTEM_DIRS):
            os.makedirs(root + path, 0o755, exist_ok=True)
            bind(path, root + path, ro)


def make_etc(root: str, spec: dict[str, Any]) -> None:
    """A tiny /etc: the loader cache, the timezone, and passwd/group naming the sandbox user."""
    etc = root + "/etc"
    os.mkdir(etc, 0o755)
    for name in ETC_FILES:
        if os.path.isfile("/etc/" + name):
            open(os.path.join(etc, name), "w").close()
            bind("/etc/" + name, os.path.join(etc, name), MS_RDONLY | MS_NOSUID | MS_NODEV)
    uid, gid = spec.get("uid") or 0, spec.get("gid") or 0
    files = {
        "passwd": f"root:x:0:0::/:/bin/false\nsandbox:x:{uid}:{gid}::/sandbox:/bin/sh\n",
        "group": f"root:x:0:\nsandbox:x:{gid}:\n",
        "hosts": "127.0.0.1 localhost\n",
    }
    for name, text in files.items():
        with open(os.path.join(etc, name), "w") as fh:
            fh.write(text)
        os.chmod(os.path.join(etc, name), 0o644)


def make_dev(root: str, box: str) -> None:
    """/dev with a few harmless character devices, /dev/shm on the box and the fd links."""
    dev = root + "/dev"
    os.mkdir(dev, 0o755)
    for name in DEVICES:
        if os.path.exists("/dev/" + name):
            open(os.path.join(dev, name), "w").close()
            bind("/dev/" + name, os.path.join(dev, name), MS_NOSUID | MS_NOEXEC)
    os.mkdir(dev + "/shm", 0o755)
    mount(box + "/shm", dev + "/shm", None, MS_BIND)
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", os.path.join(dev, name))
    os.symlink("/proc/self/fd", dev + "/fd")


def build_root(spec: dict[str, Any]) -> None:
    """The chroot: tmpfs root, read-only system binds, /etc, /dev, /sandbox, /tmp, then ro."""
    tmp = spec["tmp"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below may propagate to the host
    box = make_box(tmp, spec)
    copy_files(os.path.join(tmp, "files"), os.path.join(box, "work"), spec)
    root = os.path.join(tmp, "root")
    os.mkdir(root, 0o755)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=256,mode=0755")
    link_system(root, spec["binds"])
    make_etc(root, spec)
    make_dev(root, box)
    for name, sub in (("sandbox", "work"), ("tmp", "tmp")):
        os.mkdir(os.path.join(root, name), 0o755)
        mount(os.path.join(box, sub), os.path.join(root, name), None, MS_BIND)
    os.mkdir(root + "/proc", 0o555)
    mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def prepare_plain(spec: dict[str, Any]) -> None:
    """Fallback without a mount namespace: the work dir is a plain dir of the temp tree."""
    work = os.path.join(spec["tmp"], "work")
    os.mkdir(work, 0o700)
    chown(work, spec)
    copy_files(os.path.join(spec["tmp"], "files"), work, spec)


# ---------------------------------------------------------------- namespaces and setup


def setup(spec: dict[str, Any]) -> list[str]:
    """Enter the namespaces the spec asks for and build the filesystem; list what is used."""
    used: list[str] = []
    flags = SANDBOX_NS if spec["namespaces"] else 0
    if spec["netns"]:
        flags |= CLONE_NEWNET
    if flags:
        unshare(flags)
    if spec["namespaces"]:
        build_root(spec)
        used += ["mount-namespace", "pid-namespace", "ipc-namespace", "uts-namespace", "chroot", "tmpfs-quota"]
    else:
        prepare_plain(spec)
        used.append("temp-dir")
    if spec["netns"]:
        used.append("network-namespace")
    return used


def set_limits(spec: dict[str, Any]) -> None:
    """Hard rlimits for the payload (set as root, so they cannot be raised back)."""
    lim = spec["limits"]
    mb = 1024 * 1024
    table = {
        resource.RLIMIT_CPU: (lim["cpu_s"], lim["cpu_s"] + 1),
        resource.RLIMIT_AS: (lim["memory_mb"] * mb,) * 2,
        resource.RLIMIT_FSIZE: (lim["max_file_mb"] * mb,) * 2,
        resource.RLIMIT_NOFILE: (lim["max_open_files"],) * 2,
        resource.RLIMIT_CORE: (0, 0),
        resource.RLIMIT_MEMLOCK: (0, 0),
        resource.RLIMIT_MSGQUEUE: (0, 0),
    }
    if spec.get("uid") is not None:  # per real uid: only meaningful for our own fresh uid
        table[resource.RLIMIT_NPROC] = (lim["max_processes"],) * 2
    for which, value in table.items():
        resource.setrlimit(which, value)


def drop_privileges(spec: dict[str, Any]) -> None:
    if spec.get("uid") is None:
        return
    os.setgroups([])
    os.setresgid(spec["gid"], spec["gid"], spec["gid"])
    os.setresuid(spec["uid"], spec["uid"], spec["uid"])


def exec_payload(spec: dict[str, Any]) -> None:
    """In the payload process: limits, chroot, uid drop, seccomp, exec. Never returns."""
    fd = spec["status_fd"]
    try:
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGXCPU, signal.SIGTERM, signal.SIGINT, *ABORT_SIGNALS):
            signal.signal(sig, signal.SIG_DFL)
        set_limits(spec)
        if spec["namespaces"]:
            os.chroot(os.path.join(spec["tmp"], "root"))
            os.chdir("/sandbox")
        else:
            os.chdir(os.path.join(spec["tmp"], "work"))
        drop_privileges(spec)
        os.umask(0o077)
        os.nice(spec["nice"])
        os.set_inheritable(fd, False)
        installed = spec["seccomp"] and seccomp.install(block_sockets=spec["block_sockets"])
        if spec["block_sockets"] and not installed:
            raise SetupError("the network must be cut but no seccomp filter could be installed")
        os.execve(spec["argv"][0], spec["argv"], spec["env"])
    except BaseException as err:  # noqa: BLE001  (report anything, then die)
        emit(fd, event="error", message=f"exec failed: {type(err).__name__}: {err}")
    os._exit(127)


# ---------------------------------------------------------------- init and sweeping


def sweep(uid: int, gid: int) -> None:
    """SIGKILL every process of `uid` (that this pid namespace sees) from a helper of that uid."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)  # every process we may signal, except ourselves and init
        except BaseException:  # noqa: BLE001  (ESRCH: nothing left)
            pass
        os._exit(0)
    os.waitpid(pid, 0)


def reap_until(payload: int) -> tuple[int, float]:
    """Reap children (orphans too, as init/subreaper) until the payload exits; sum their CPU."""
    cpu = 0.0
    while True:
        try:
            pid, status, usage = os.wait4(-1, 0)
        except ChildProcessError:
            return 0, cpu
        except InterruptedError:
            continue
        cpu += usage.ru_utime + usage.ru_stime
        if pid == payload:
            return status, cpu


def run_init(spec: dict[str, Any]) -> None:
    """pid 1 of the sandbox (or a subreaper): mount /proc, start the payload, report its exit."""
    fd = spec["status_fd"]
    for sig in ABORT_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    try:
        die_with_parent(None, signal.SIGKILL)
        if spec["namespaces"]:
            root = os.path.join(spec["tmp"], "root")
            mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
        else:
            _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(CHILD_SUBREAPER)")
    except SetupError as err:
        emit(fd, event="error", message=str(err))
        os._exit(1)
    payload = os.fork()
    if payload == 0:
        exec_payload(spec)
    status, cpu = reap_until(payload)
    emit(fd, event="exit", status=status, cpu_s=round(cpu, 4))
    if spec.get("uid") is not None:
        sweep(spec["uid"], spec["gid"])
        while True:
            try:
                os.wait4(-1, 0)
            except ChildProcessError:
                break
            except InterruptedError:
                continue
    os._exit(0)


def remove_tree_and_exit(path: str, host_mount_ns: int | None) -> None:
    """Become `rm -rf --one-file-system path` in the host mount namespace (no mounts there).

    No fork: after init died, this process can no longer fork into its pid namespace.
    """
    try:
        if host_mount_ns is not None:
            _check(_libc.setns(host_mount_ns, CLONE_NEWNS), "setns(host mount namespace)")
        os.chdir("/")
        os.execv("/bin/rm", ["rm", "-rf", "--one-file-system", path])
    finally:
        os._exit(1)


def wait_or_abort(pid: int, spec: dict[str, Any], host_mount_ns: int | None) -> None:
    """Wait for init; on Abort (deadline, parent gone) kill it and sweep the sandbox uid.

    `waitid(WNOWAIT)` leaves init unreaped, so its pid cannot be reused before the kill.
    """
    signal.setitimer(signal.ITIMER_REAL, spec["deadline_s"])
    aborted = True
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        aborted = False
    except Abort:
        pass
    signal.setitimer(signal.ITIMER_REAL, 0)
    for sig in ABORT_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if aborted:
        os.kill(pid, signal.SIGKILL)  # ends the pid namespace
    os.waitpid(pid, 0)
    if not aborted:
        return
    if spec.get("uid") is not None and not spec["namespaces"]:
        sweep(spec["uid"], spec["gid"])  # what outlived init without a pid namespace
    remove_tree_and_exit(spec["tmp"], host_mount_ns)  # the parent may be gone: nobody else will


def launch(spec: dict[str, Any]) -> int:
    fd = spec["status_fd"]
    for sig in ABORT_SIGNALS:
        signal.signal(sig, _abort)
    try:
        die_with_parent(spec["parent_pid"], signal.SIGUSR1)
        host_mount_ns = os.open("/proc/self/ns/mnt", os.O_RDONLY) if spec["namespaces"] else None
        used = setup(spec)
    except (SetupError, OSError) as err:
        emit(fd, event="error", message=f"setup failed: {err}")
        return 1
    if spec["seccomp"] and seccomp.supported():
        used.append("seccomp-socket-block" if spec["block_sockets"] else "seccomp")
    emit(fd, event="ready", isolation=used)
    pid = os.fork()
    if pid == 0:
        if host_mount_ns is not None:
            os.close(host_mount_ns)
        run_init(spec)
    wait_or_abort(pid, spec, host_mount_ns)
    return 0


# ---------------------------------------------------------------- probe


def _try_in_child(fn: Any) -> bool:
    """Run `fn` in a forked child (so namespaces never touch this process); True if it worked."""
    pid = os.fork()
    if pid == 0:
        try:
            fn()
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def probe(scratch: str) -> dict[str, bool]:
    """Which isolation features the kernel grants here (each tried in a throwaway child)."""

    def mount_ns() -> None:
        unshare(SANDBOX_NS)
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m")

    return {
        "root": os.geteuid() == 0,
        "namespaces": _try_in_child(mount_ns),
        "netns": _try_in_child(lambda: unshare(CLONE_NEWNET)),
        "seccomp": seccomp.supported() and _try_in_child(lambda: seccomp.install(block_sockets=True)),
    }


def main(argv: list[str]) -> int:
    if argv[1:2] == ["--probe"]:
        print(json.dumps(probe(argv[2])))
        return 0
    if argv[1:2] == ["--sweep"]:
        sweep(int(argv[2]), int(argv[3]))
        return 0
    return launch(json.loads(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
