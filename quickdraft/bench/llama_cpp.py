"""llama.cpp on a GGUF file (a peer build, see ../shared/PEERS.md): its decode speed and its greedy tokens.

    decode_tokens_per_second(Path("build/bin"), Path("model.gguf"), threads=2, tokens=64, repeats=5)
    greedy_continuations(Path("build/bin"), Path("model.gguf"), [[1, 2, 3]], tokens=64, threads=2)

The first runs `llama-bench -p 0 -n TOKENS -r REPEATS -t THREADS -fa 0 -o json` (token generation only,
flash attention off as PEERS.md advises on CPU) and returns the median of its per-repeat tokens/s. The second
starts `llama-server` on a free local port, asks `/completion` for each prompt's greedy continuation (token
ids in, token ids out, end of sequence ignored) and stops the server.
"""

import json
import socket
import statistics
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from quickdraft.errors import UsageError

BENCH_TIMEOUT_SECONDS = 600
SERVER_START_SECONDS = 120  # a llama-server loads a small GGUF in seconds


def llama_bench(bin_dir: Path) -> Path:
    """The `llama-bench` binary of a llama.cpp build's bin/ folder (a UsageError when it has none)."""
    binary = Path(bin_dir) / "llama-bench"
    if not binary.is_file():
        raise UsageError(f"no llama-bench in {bin_dir}; pass the bin/ folder of a llama.cpp build to --llama-cpp")
    return binary


def decode_tokens_per_second(bin_dir: Path, gguf: Path, threads: int, tokens: int, repeats: int) -> float:
    command = [str(llama_bench(bin_dir)), "-m", str(gguf), "-p", "0", "-n", str(tokens), "-r", str(repeats)]
    command += ["-t", str(threads), "-fa", "0", "-o", "json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=BENCH_TIMEOUT_SECONDS)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"llama-bench failed on {gguf} (exit {done.returncode}): {last}")
    try:
        (result,) = json.loads(done.stdout)
        return statistics.median(float(speed) for speed in result["samples_ts"])
    except (ValueError, KeyError, TypeError) as error:
        raise UsageError(
            f"llama-bench printed no result this version reads ({error}); use the PEERS.md build"
        ) from error


def llama_server(bin_dir: Path) -> Path:
    """The `llama-server` binary of a llama.cpp build's bin/ folder (a UsageError when it has none)."""
    binary = Path(bin_dir) / "llama-server"
    if not binary.is_file():
        raise UsageError(f"no llama-server in {bin_dir}; pass the bin/ folder of a llama.cpp build to --llama-cpp")
    return binary


def greedy_continuations(
    bin_dir: Path, gguf: Path, prompts: Sequence[Sequence[int]], tokens: int, threads: int
) -> list[list[int]]:
    """llama.cpp's greedy continuation of `tokens` tokens for each prompt, as token ids."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [str(llama_server(bin_dir)), "-m", str(gguf), "-t", str(threads), "-np", "1", "-c", "4096"]
    command += ["-fa", "off", "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_until_ready(server, base, gguf)
        request = {"n_predict": tokens, "temperature": 0.0, "ignore_eos": True, "return_tokens": True}
        request["cache_prompt"] = False
        return [_post(base + "/completion", {**request, "prompt": list(prompt)})["tokens"] for prompt in prompts]
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


def _wait_until_ready(server: subprocess.Popen, base: str, gguf: Path) -> None:
    deadline = time.monotonic() + SERVER_START_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            last = (server.stderr.read().strip().splitlines() or ["no output"])[-1]
            raise UsageError(f"llama-server exited on {gguf} (exit {server.returncode}): {last}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise UsageError(f"llama-server did not become ready on {gguf} within {SERVER_START_SECONDS} s")


def _post(url: str, body: dict) -> dict:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=BENCH_TIMEOUT_SECONDS) as answer:
            reply = json.loads(answer.read())
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise UsageError(f"llama-server did not answer {url}: {error}") from error
    if not isinstance(reply, dict) or not isinstance(reply.get("tokens"), list):
        raise UsageError("llama-server's /completion returned no token ids; use the PEERS.md build")
    return reply
