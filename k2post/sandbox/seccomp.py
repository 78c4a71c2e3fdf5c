"""A hand-built seccomp-BPF filter, installed with `prctl` through ctypes (stdlib only).

The launcher imports this module by path (it runs as `python -I -S`, without the venv), so
it must not import anything outside the standard library.

The filter is a deny-list on top of the uid drop and the rlimits:

- syscalls that only a privileged or escaping program needs (mount, unshare, setns,
  pivot_root, chroot, ptrace, bpf, keyctl, perf_event_open, io_uring, kexec, modules,
  process_vm_*, the new mount API, ...) fail with EPERM;
- `clone` with any namespace flag fails with EPERM; `clone3` (whose flags live in memory
  that BPF cannot read) fails with ENOSYS, so libc falls back to `clone`;
- with `block_sockets`, `socket()` of any family other than AF_UNIX fails with EACCES
  (the "blocked" network mode used when no network namespace can be made);
- syscalls of a foreign ABI (x32, or i386 through `int 0x80`) fail with EPERM.

Only x86_64 and aarch64 are known; elsewhere `install` returns False and nothing is filtered.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
LD_W_ABS = 0x20
JEQ_K = 0x15
JGE_K = 0x35
JSET_K = 0x45
RET_K = 0x06

AF_UNIX = 1
CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080
"""CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME."""

DENIED = (
    "unshare setns mount umount2 pivot_root chroot ptrace bpf keyctl add_key request_key "
    "perf_event_open userfaultfd kexec_load kexec_file_load init_module finit_module "
    "delete_module reboot swapon swapoff open_by_handle_at name_to_handle_at io_uring_setup "
    "io_uring_enter io_uring_register process_vm_readv process_vm_writev open_tree move_mount "
    "fsopen fsconfig fsmount fspick mount_setattr syslog acct"
).split()

_X86_64 = {
    "socket": 41,
    "clone": 56,
    "clone3": 435,
    "unshare": 272,
    "setns": 308,
    "mount": 165,
    "umount2": 166,
    "pivot_root": 155,
    "chroot": 161,
    "ptrace": 101,
    "bpf": 321,
    "keyctl": 250,
    "add_key": 248,
    "request_key": 249,
    "perf_event_open": 298,
    "userfaultfd": 323,
    "kexec_load": 246,
    "kexec_file_load": 320,
    "init_module": 175,
    "finit_module": 313,
    "delete_module": 176,
    "reboot": 169,
    "swapon": 167,
    "swapoff": 168,
    "open_by_handle_at": 304,
    "name_to_handle_at": 303,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
    "syslog": 103,
    "acct": 163,
}
_AARCH64 = {
    "socket": 198,
    "clone": 220,
    "clone3": 435,
    "unshare": 97,
    "setns": 268,
    "mount": 40,
    "umount2": 39,
    "pivot_root": 41,
    "chroot": 51,
    "ptrace": 117,
    "bpf": 280,
    "keyctl": 219,
    "add_key": 217,
    "request_key": 218,
    "perf_event_open": 241,
    "userfaultfd": 282,
    "kexec_load": 104,
    "kexec_file_load": 294,
    "init_module": 105,
    "finit_module": 273,
    "delete_module": 106,
    "reboot": 142,
    "swapon": 224,
    "swapoff": 225,
    "open_by_handle_at": 265,
    "name_to_handle_at": 264,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "process_vm_readv": 270,
    "process_vm_writev": 271,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
    "syslog": 116,
    "acct": 89,
}
ARCHES = {"x86_64": (0xC000003E, _X86_64), "aarch64": (0xC00000B7, _AARCH64)}

Insn = tuple[int, int, int, int]


def _stmt(code: int, k: int) -> Insn:
    return (code, 0, 0, k)


def _jump(code: int, k: int, jt: int, jf: int) -> Insn:
    return (code, jt, jf, k)


def _errno(err: int) -> Insn:
    return _stmt(RET_K, RET_ERRNO | err)


def _header(audit_arch: int, x86: bool) -> list[Insn]:
    """Check the ABI, then load the syscall number into A."""
    prog = [_stmt(LD_W_ABS, 4), _jump(JEQ_K, audit_arch, 1, 0), _errno(errno.EPERM), _stmt(LD_W_ABS, 0)]
    if x86:  # x32 syscalls carry bit 30
        prog += [_jump(JGE_K, 0x40000000, 0, 1), _errno(errno.EPERM)]
    return prog


def _arg_check(nr: int, arg_insns: list[Insn]) -> list[Insn]:
    """`if A == nr: <load arg0; arg_insns (which must all return)>`; A is kept otherwise."""
    body = [_stmt(LD_W_ABS, 16), *arg_insns]
    return [_jump(JEQ_K, nr, 0, len(body)), *body]


def build_filter(arch: str, block_sockets: bool) -> list[Insn]:
    """The BPF program (list of (code, jt, jf, k)) for `arch`; KeyError for an unknown arch."""
    audit_arch, table = ARCHES[arch]
    prog = _header(audit_arch, arch == "x86_64")
    for name in DENIED:
        prog += [_jump(JEQ_K, table[name], 0, 1), _errno(errno.EPERM)]
    prog += [_jump(JEQ_K, table["clone3"], 0, 1), _errno(errno.ENOSYS)]
    clone_flags = [_jump(JSET_K, CLONE_NS_FLAGS, 0, 1), _errno(errno.EPERM), _stmt(RET_K, RET_ALLOW)]
    prog += _arg_check(table["clone"], clone_flags)
    if block_sockets:
        unix_only = [_jump(JEQ_K, AF_UNIX, 0, 1), _stmt(RET_K, RET_ALLOW), _errno(errno.EACCES)]
        prog += _arg_check(table["socket"], unix_only)
    return prog + [_stmt(RET_K, RET_ALLOW)]


def supported() -> bool:
    """Whether this machine's architecture has a syscall table here."""
    return platform.machine() in ARCHES


def install(block_sockets: bool) -> bool:
    """Set no_new_privs and load the filter into this process (inherited across exec).

    Returns False on an unknown architecture; raises OSError when the kernel refuses.
    """
    if not supported():
        return False
    prog = build_filter(platform.machine(), block_sockets)
    raw = b"".join(struct.pack("HBBI", *insn) for insn in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class _Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = _Fprog(len(prog), ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    calls = ((PR_SET_NO_NEW_PRIVS, 1, None), (PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog)))
    for option, arg2, arg3 in calls:
        if libc.prctl(option, arg2, arg3, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl({option}) failed: {errno.errorcode.get(err, err)}")
    return True
