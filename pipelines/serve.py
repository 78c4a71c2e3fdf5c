"""`k2post serve MODEL_DIR`: serve a checkpoint with vLLM's OpenAI-compatible server, in the foreground.

    k2post serve artifacts/models/tiny-qwen2 --port 8000 [--api-key KEY] [--host 127.0.0.1]
    python -m k2post_pipelines.serve artifacts/models/tiny-qwen2 --port 0

Prints `serving DIR at URL (pid N, log PATH)` once `/health` answers; Ctrl-C or SIGTERM stops the
server (its whole process group). A bad flag, or a server that exits or never gets healthy, is one line
`k2post serve: error: ...` (after the server log's tail) and exit status 2. Library: k2post/llm/serve.py.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from k2post.command import command_parser, run_command


def build_parser() -> argparse.ArgumentParser:
    """The `k2post serve` flags (defaults from `ServeConfig`)."""
    from k2post.llm.serve import ServeConfig

    defaults = ServeConfig()
    parser = command_parser("serve", "serve a checkpoint with vLLM's OpenAI-compatible server")
    parser.add_argument("model_dir", help="HF model directory to serve (its tokenizer's chat template is used)")
    parser.add_argument("--host", default=defaults.host, help="bind address (default 127.0.0.1; others need --api-key)")
    parser.add_argument("--port", type=int, default=defaults.port, help="TCP port (default 8000; 0 picks a free one)")
    parser.add_argument("--api-key", default=None, help="require this bearer token (or set K2POST_API_KEY)")
    parser.add_argument("--served-model-name", default=None, help="model name clients send (default: MODEL_DIR)")
    parser.add_argument("--max-model-len", type=int, default=defaults.max_model_len, help="longest prompt+response")
    parser.add_argument("--dtype", default=defaults.dtype, help="float32 (default), bfloat16, float16 or auto")
    parser.add_argument(
        "--startup-timeout", type=float, default=defaults.startup_timeout_s, help="seconds to wait for /health"
    )
    parser.add_argument("--log", default=None, help="server log file (default: a temp file)")
    return parser


def serve_config_from_args(args: argparse.Namespace):
    """The validated `ServeConfig` of the flags (API key also from $K2POST_API_KEY); a bad value is a ConfigError."""
    from k2post.config.loader import validate_config
    from k2post.llm.serve import ServeConfig

    raw = {
        "model_dir": args.model_dir,
        "host": args.host,
        "port": args.port,
        "api_key": args.api_key or os.environ.get("K2POST_API_KEY") or None,
        "served_model_name": args.served_model_name,
        "max_model_len": args.max_model_len,
        "dtype": args.dtype,
        "startup_timeout_s": args.startup_timeout,
        "log_path": args.log,
    }
    return validate_config(ServeConfig, raw, "command line")


def run(args: argparse.Namespace) -> int:
    """Start the server, wait on it; SIGTERM / Ctrl-C stop it (ServerStartError goes to the error wrapper)."""
    from k2post.llm.serve import start_server

    cfg = serve_config_from_args(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `finally` below then stops the server
    handle = start_server(cfg)
    print(
        f"serving {cfg.model_dir} at {handle.base_url} (pid {handle.pid}, log {handle.log_path}); Ctrl-C stops",
        flush=True,
    )
    try:
        return handle.process.wait() if handle.process is not None else 0
    except KeyboardInterrupt:
        return 0
    finally:
        handle.stop()


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, run)


if __name__ == "__main__":
    raise SystemExit(main())
