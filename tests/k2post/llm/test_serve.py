"""`k2post serve` pieces that need no model: config checks, command line, env, start failures, one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from k2post.llm.serve import (
    ServeConfig,
    ServerHandle,
    ServerStartError,
    _on_cpu,
    build_command,
    build_env,
    free_port,
    wait_ready,
)
from k2post_pipelines.serve import build_parser, main, serve_config_from_args


def test_defaults_bind_loopback_without_key():
    cfg = ServeConfig(model_dir="m")
    assert cfg.host == "127.0.0.1" and cfg.api_key is None and cfg.dtype == "float32"


def test_non_loopback_host_needs_api_key():
    with pytest.raises(ValidationError, match="not loopback"):
        ServeConfig(model_dir="m", host="0.0.0.0")
    assert ServeConfig(model_dir="m", host="0.0.0.0", api_key="k").api_key == "k"


def test_command_uses_module_entrypoint_and_keeps_key_off_the_command_line():
    cfg = ServeConfig(model_dir="/models/x", api_key="s3cret", max_model_len=256, served_model_name="x")
    command = build_command(cfg, 1234)
    assert command[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(command)
    assert "--model /models/x" in joined and "--host 127.0.0.1" in joined and "--port 1234" in joined
    assert "--max-model-len 256" in joined and "--enforce-eager" in joined and "--served-model-name x" in joined
    assert "--enable-auto-tool-choice --tool-call-parser kimi_k2" in joined
    assert "s3cret" not in joined
    if _on_cpu():
        assert f"--kv-cache-memory-bytes {2**30}" in joined
    env = build_env(cfg)
    assert env["VLLM_API_KEY"] == "s3cret" and "VLLM_CPU_KVCACHE_SPACE" not in env


def test_env_drops_inherited_key_when_none_configured(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "leaked")
    assert "VLLM_API_KEY" not in build_env(ServeConfig(model_dir="m"))


def test_empty_model_dir_is_an_error():
    with pytest.raises(ValueError, match="model_dir"):
        build_command(ServeConfig(), 1)


def test_cli_serve_flags_build_the_config(monkeypatch):
    monkeypatch.setenv("K2POST_API_KEY", "from-env")
    args = build_parser().parse_args(["/models/x", "--port", "0", "--max-model-len", "128"])
    cfg = serve_config_from_args(args)
    assert (cfg.model_dir, cfg.port, cfg.max_model_len, cfg.api_key, cfg.host) == (
        "/models/x",
        0,
        128,
        "from-env",
        "127.0.0.1",
    )


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["/m", "--host", "0.0.0.0"], "command line: <top level>: host '0.0.0.0' is not loopback: set api_key"),
        (["/m", "--dtype", "fp8"], "command line: dtype: Input should be"),
    ],
)
def test_bad_flags_are_one_line(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("k2post serve: error: ") and needle in err and err.count("\n") == 1, err


def test_a_server_that_does_not_start_ends_with_one_error_line(capsys, monkeypatch):
    def fail(cfg):
        raise ServerStartError(f"vLLM server exited with status 1 before it was ready; log {cfg.log_path}:\nboom")

    monkeypatch.setattr("k2post.llm.serve.start_server", fail)
    monkeypatch.setattr("k2post_pipelines.serve.signal.signal", lambda *args: None)  # leave pytest's SIGTERM alone
    assert main(["/m", "--log", "/tmp/s.log"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "boom",
        "k2post serve: error: vLLM server exited with status 1 before it was ready; log /tmp/s.log",
    ]


def test_free_port_is_bindable():
    assert 0 < free_port() < 65536


def test_server_that_dies_raises_with_log_tail(tmp_path):
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", "print('boom: bad model'); raise SystemExit(3)"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    handle = ServerHandle(process.pid, f"http://127.0.0.1:{free_port()}/v1", None, str(log), process)
    with pytest.raises(ServerStartError, match="status 3") as info:
        wait_ready(handle, timeout_s=20, poll_s=0.05)
    assert "boom: bad model" in str(info.value)


def test_server_that_never_answers_times_out_and_is_stopped(tmp_path):
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(60)"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    handle = ServerHandle(process.pid, f"http://127.0.0.1:{free_port()}/v1", None, str(log), process)
    with pytest.raises(ServerStartError, match="within 1s"):
        wait_ready(handle, timeout_s=1, poll_s=0.1)
    assert process.poll() is not None and not handle.alive()
