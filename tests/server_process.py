"""Starting a real `quickdraft serve` process on loopback for the server tests, and reading /metrics."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent
METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$")


@dataclass
class ServerProcess:
    process: subprocess.Popen
    port: int
    log_path: Path
    api_key: str | None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """Every sample of GET /metrics as {'name{labels}': value}."""
        response = httpx.get(f"{self.base_url}/metrics", headers=self.headers, timeout=10)
        response.raise_for_status()
        samples = (METRIC_LINE.match(line) for line in response.text.splitlines() if not line.startswith("#"))
        return {match[1]: float(match[2]) for match in samples if match}

    def stop(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(
    model_dir: Path, log_path: Path, *extra_args: str, api_key: str | None = None, timeout: float = 180
) -> ServerProcess:
    """`python -m quickdraft serve` on a free loopback port; returns once GET /health is 200."""
    port = free_port()
    command = [sys.executable, "-m", "quickdraft", "serve", "--model", str(model_dir), "--port", str(port), *extra_args]
    if api_key:
        command += ["--api-key", api_key]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    server = ServerProcess(process, port, log_path, api_key)
    _wait_until_healthy(server, timeout)
    return server


def _wait_until_healthy(server: ServerProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"the server exited with {server.process.returncode}:\n{server.log()}")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"the server was not healthy after {timeout} s:\n{server.log()}")
