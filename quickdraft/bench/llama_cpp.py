"""llama.cpp's own decode speed on a GGUF file, from its `llama-bench` (a peer build, see ../shared/PEERS.md).

    decode_tokens_per_second(Path("build/bin"), Path("model.gguf"), threads=2, tokens=64, repeats=5)

Runs `llama-bench -p 0 -n TOKENS -r REPEATS -t THREADS -fa 0 -o json` (token generation only, flash
attention off as PEERS.md advises on CPU) and returns the median of its per-repeat tokens/s.
"""

import json
import statistics
import subprocess
from pathlib import Path

from quickdraft.errors import UsageError

BENCH_TIMEOUT_SECONDS = 600


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
