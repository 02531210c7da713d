"""llama.cpp on a GGUF file (a peer build, see ../shared/PEERS.md): its decode speed and its greedy tokens.

    decode_tokens_per_second(Path("build/bin"), Path("model.gguf"), threads=2, tokens=64, repeats=5)
    greedy_continuations(Path("build/bin"), Path("model.gguf"), [[1, 2, 3]], tokens=64, threads=2)

The first runs `llama-bench -p 0 -n TOKENS -r REPEATS -t THREADS -fa 0 -o json` (token generation only,
flash attention off as PEERS.md advises on CPU) and returns the median of its per-repeat tokens/s. The second
starts a `LlamaServer` (llama-server on a free local port), asks `/completion` for each prompt's greedy
continuation (token ids in, token ids out, end of sequence ignored) and stops the server. `quickdraft bench
--llama-cpp` times generations through a `LlamaServer` too (`bench/methods.LlamaCppGenerate`).
"""

import json
import signal
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
        raise UsageError(_ended_early("llama-bench", "running", done.returncode, gguf, last))
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
    with LlamaServer(bin_dir, gguf, threads) as server:
        return [server.complete(prompt, tokens, temperature=0.0, ignore_eos=True)["tokens"] for prompt in prompts]


class LlamaServer:
    """A `llama-server` on a free local port for one GGUF file, one slot, prompt cache off: a context manager
    that starts it (and waits until it is ready) and stops it. `extra_args` are passed on, e.g. its n-gram
    speculation, `("--spec-type", "ngram-simple")`."""

    def __init__(self, bin_dir: Path, gguf: Path, threads: int, extra_args: Sequence[str] = ()) -> None:
        self.gguf = Path(gguf)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.command = [str(llama_server(bin_dir)), "-m", str(gguf), "-t", str(threads), "-np", "1", "-c", "4096"]
        self.command += ["-fa", "off", "--host", "127.0.0.1", "--port", str(port), *extra_args]
        self.base = f"http://127.0.0.1:{port}"
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> "LlamaServer":
        self._process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            _wait_until_ready(self._process, self.base, self.gguf)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
        self._process = None

    def complete(self, prompt: Sequence[int], tokens: int, temperature: float, ignore_eos: bool = False) -> dict:
        """POST /completion: `prompt` token ids in, at most `tokens` new ones; sampling is plain temperature
        sampling (top-k, top-p and min-p off; greedy at 0). Returns llama-server's reply: "tokens" (the new token
        ids) and "timings" (its own prompt_ms, predicted_ms, predicted_n, draft_n, draft_n_accepted)."""
        request = {"prompt": list(prompt), "n_predict": tokens, "temperature": temperature, "top_k": 0}
        request |= {"top_p": 1.0, "min_p": 0.0, "ignore_eos": ignore_eos, "return_tokens": True, "cache_prompt": False}
        return _post(self.base + "/completion", request)


def _ended_early(program: str, doing: str, returncode: int, gguf: Path, last: str) -> str:
    """Why a llama.cpp `program` (llama-bench, llama-server) ended before giving what it was run for, in one line:
    its exit code, or the signal that stopped it while `doing` the model (a crash of that build on this CPU, not a
    fault of the model: on an Intel Xeon with AMX, llama.cpp 0c1e57098's default weight repacking crashes
    llama-server at start and llama-bench's prompt blocks, docs/native_runtime.md, stop 61)."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:  # a signal number the enum does not name (the real-time ones)
            name = f"signal {-returncode}"
        return (
            f"{program} crashed ({name}) while {doing} {gguf}: a fault of that llama.cpp build on this CPU; "
            f"run the same command by hand to see it (its last line: {last})"
        )
    return f"{program} exited on {gguf} (exit {returncode}): {last}"


def _wait_until_ready(server: subprocess.Popen, base: str, gguf: Path) -> None:
    deadline = time.monotonic() + SERVER_START_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            last = (server.stderr.read().strip().splitlines() or ["no output"])[-1]
            raise UsageError(_ended_early("llama-server", "loading", server.returncode, gguf, last))
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
