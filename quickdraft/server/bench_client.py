"""Client-side measurements of a running `quickdraft serve`: streaming speed and a bounded load test.

    python -m quickdraft.server.bench_client stream --url http://127.0.0.1:8000 --model NAME --prompt "..."
    python -m quickdraft.server.bench_client load --url http://127.0.0.1:8000 --model NAME

`stream` sends the same greedy streamed chat request with the server's speculation and with
`"quickdraft": {"drafter": "none"}`, alternating, and prints the medians of time to first token
and tokens per second of each, their ratio, and whether the outputs were identical.
`load` runs a fixed number of clients, each sending a fixed number of requests (chat and text,
streamed and not), and prints status counts, latency percentiles and throughput. Both stop by
themselves: every loop is bounded and every request has a timeout. Standard library only.
"""

import argparse
import http.client
import json
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

REQUEST_TIMEOUT_SECONDS = 300


@dataclass(frozen=True)
class StreamResult:
    """One streamed request as the client saw it."""

    status: int
    text: str
    completion_tokens: int
    ttft: float  # seconds from sending to the first non-empty text
    total: float  # seconds from sending to [DONE]
    finish_reason: str | None
    speculation: dict

    @property
    def tokens_per_second(self) -> float:
        """Output tokens after the first over the time after the first: the speed of the stream itself."""
        return (self.completion_tokens - 1) / (self.total - self.ttft) if self.total > self.ttft else 0.0


def post(url: str, api_key: str | None, path: str, body: dict) -> http.client.HTTPResponse:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=REQUEST_TIMEOUT_SECONDS)
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {api_key}"} if api_key else {})
    connection.request("POST", path, json.dumps(body), headers)
    return connection.getresponse()


def stream(url: str, api_key: str | None, path: str, body: dict) -> StreamResult:
    """Send a streamed request with usage included; read it to [DONE]."""
    started = time.perf_counter()
    response = post(url, api_key, path, body | {"stream": True, "stream_options": {"include_usage": True}})
    if response.status != 200:
        return StreamResult(response.status, response.read().decode(), 0, 0.0, time.perf_counter() - started, None, {})
    pieces, first, usage, finish_reason, speculation = [], None, {}, None, {}
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        usage = chunk.get("usage") or usage
        speculation = chunk.get("speculation", speculation)
        for choice in chunk.get("choices", []):
            piece = choice.get("delta", {}).get("content") or choice.get("text") or ""
            first = first or (time.perf_counter() if piece else None)
            pieces.append(piece)
            finish_reason = choice.get("finish_reason") or finish_reason
    total = time.perf_counter() - started
    ttft = (first - started) if first else total
    return StreamResult(
        200, "".join(pieces), usage.get("completion_tokens", 0), ttft, total, finish_reason, speculation
    )


def compare_speculation(args: argparse.Namespace) -> int:
    body = {
        "model": args.model,
        "messages": [{"role": "user", "content": args.prompt}],
        "max_tokens": args.max_tokens,
        "temperature": 0,
    }
    without = body | {"quickdraft": {"drafter": "none"}}
    stream(args.url, args.api_key, "/v1/chat/completions", body | {"max_tokens": 8})  # warm-up
    runs: dict[str, list[StreamResult]] = {"speculation": [], "no speculation": []}
    for _ in range(args.rounds):
        runs["speculation"].append(stream(args.url, args.api_key, "/v1/chat/completions", body))
        runs["no speculation"].append(stream(args.url, args.api_key, "/v1/chat/completions", without))
    texts = {result.text for results in runs.values() for result in results}
    for name, results in runs.items():
        print(_stream_summary(name, results))
    speedup = _median(runs["speculation"], "tokens_per_second") / _median(runs["no speculation"], "tokens_per_second")
    print(f"tokens/s ratio (speculation / none): {speedup:.2f}x; outputs identical: {len(texts) == 1}")
    return 0 if len(texts) == 1 else 1


def _stream_summary(name: str, results: list[StreamResult]) -> str:
    last = results[-1]
    spec = last.speculation
    return (
        f"{name:>15}: {len(results)} runs, {last.completion_tokens} tokens ({last.finish_reason}), "
        f"median TTFT {_median(results, 'ttft') * 1000:.0f} ms, "
        f"median {_median(results, 'tokens_per_second'):.1f} tok/s, "
        f"median total {_median(results, 'total'):.2f} s; drafter {spec.get('drafter')}, "
        f"acceptance {spec.get('acceptance_rate', 0):.1%}, "
        f"mean accepted length {spec.get('mean_accepted_length', 1):.2f}"
    )


def _median(results: list[StreamResult], field: str) -> float:
    return statistics.median(getattr(result, field) for result in results)


def load_test(args: argparse.Namespace) -> int:
    def one_client(index: int) -> list[tuple[int, bool, float]]:
        return [_one_load_request(args, index, request) for request in range(args.requests)]

    started = time.perf_counter()
    with ThreadPoolExecutor(args.clients) as pool:
        results = [result for client in pool.map(one_client, range(args.clients)) for result in client]
    elapsed = time.perf_counter() - started
    statuses = Counter(status for status, _, _ in results)
    latencies = sorted(latency for _, _, latency in results)
    valid = sum(ok for _, ok, _ in results)
    print(
        f"load test: {args.clients} clients x {args.requests} requests = {len(results)} in {elapsed:.1f} s "
        f"({len(results) / elapsed:.2f} req/s); statuses {dict(sorted(statuses.items()))}; "
        f"valid {valid}/{len(results)}; "
        f"latency p50 {_percentile(latencies, 50):.2f} s, p95 {_percentile(latencies, 95):.2f} s, "
        f"max {latencies[-1]:.2f} s"
    )
    return 0 if valid == len(results) else 1


def _one_load_request(args: argparse.Namespace, client: int, request: int) -> tuple[int, bool, float]:
    """(status, valid, seconds) of request number `request` of one client: chat/text, streamed or not."""
    chat = (client + request) % 2 == 0
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = {"model": args.model, "max_tokens": args.max_tokens, "seed": request}
    body |= (
        {"messages": [{"role": "user", "content": f"Say something about the number {request}."}]}
        if chat
        else {"prompt": f"Number {request} is"}
    )
    started = time.perf_counter()
    if request % 3 == 0:
        result = stream(args.url, args.api_key, path, body)
        return (
            result.status,
            result.status == 200 and result.finish_reason in ("stop", "length"),
            time.perf_counter() - started,
        )
    response = post(args.url, args.api_key, path, body)
    payload = json.loads(response.read() or b"{}")
    valid = (
        response.status == 200
        and payload.get("choices", [{}])[0].get("finish_reason") in ("stop", "length")
        and "usage" in payload
    )
    return response.status, valid, time.perf_counter() - started


def _percentile(sorted_values: list[float], percent: int) -> float:
    return sorted_values[min(len(sorted_values) - 1, round(percent / 100 * (len(sorted_values) - 1)))]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m quickdraft.server.bench_client", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default http://127.0.0.1:8000)")
    parser.add_argument("--api-key", default=None, help="the server's API key, if it has one")
    parser.add_argument("--model", required=True, help="the served model name")
    commands = parser.add_subparsers(dest="command", required=True)
    compare = commands.add_parser(
        "stream", help="TTFT and tokens/s of one streamed greedy chat request, with and without speculation"
    )
    compare.add_argument("--prompt", required=True)
    compare.add_argument("--max-tokens", type=int, default=128)
    compare.add_argument("--rounds", type=int, default=5, help="requests per mode, alternating (default 5)")
    compare.set_defaults(func=compare_speculation)
    load = commands.add_parser("load", help="a bounded load test: N clients x M requests, all at once")
    load.add_argument("--clients", type=int, default=8)
    load.add_argument("--requests", type=int, default=10, help="requests per client (default 10)")
    load.add_argument("--max-tokens", type=int, default=32)
    load.set_defaults(func=load_test)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
