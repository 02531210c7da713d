#!/usr/bin/env bash
# The serving sweep of BENCHMARKS.md: quickdraft serve with and without speculation, and llama-server on the
# same GGUF when given its binaries (plain and with --spec-type ngram-simple), each measured by
# `quickdraft bench-serve` at 1, 2, 4, 8 and 16 streams.
#   scripts/serve_sweep.sh OUT [LLAMA_CPP_BIN]      # e.g. scripts/serve_sweep.sh bench-out/serve "$(../shared/tools/build-llama-cpp.sh)"
# Environment: MODEL (smollm2-135m-instruct), THREADS (2), MAX_BATCH (16), PROMPTS (../shared/data/specbench_dev.jsonl),
# DRAFTER (serve's default drafters, what "speculation" runs: e.g. ngram,head; unset: serve's own default),
# ALSO (more drafter settings measured on the same server, each named in the request body, separated by ';', e.g.
# ALSO=ngram: n-gram lookup alone beside the default),
# LLAMA_ARGS (more llama-server arguments, e.g. --no-repack where its AMX weight repacking crashes, stop 61),
# CONCURRENCY (1,2,4,8,16), MAX_TOKENS (128), STEP_TOKENS (serve's default), REQUESTS (bench-serve's default,
# max(C, prompts) at concurrency C: one burst at 16; more keep C streams busy longer), ROUNDS (1: quickdraft's
# configurations are measured that many times on one server, a level at a time, back to back, and each round's
# levels merged into one run per configuration (`bench-serve --merge`); the combined report then compares them round
# by round). Run it on an otherwise idle machine.
set -euo pipefail
out=${1:?usage: scripts/serve_sweep.sh OUT [LLAMA_CPP_BIN]}
llama_bin=${2:-}
model=${MODEL:-smollm2-135m-instruct}
threads=${THREADS:-2}
max_batch=${MAX_BATCH:-16}
prompts=${PROMPTS:-../shared/data/specbench_dev.jsonl}
levels=${CONCURRENCY:-1,2,4,8,16}
tokens=${MAX_TOKENS:-128}
step_tokens=${STEP_TOKENS:-}
drafter=${DRAFTER:-}
also=${ALSO:-}
requests=${REQUESTS:-}
read -ra llama_args <<< "${LLAMA_ARGS:-}"
rounds=${ROUNDS:-1}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a positive integer, got '$rounds'" >&2; exit 2; }
bin="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin"
mkdir -p "$out"
port=8123

wait_healthy() {
  for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$1/health" >/dev/null; then return 0; fi
    sleep 0.5
  done
  echo "server on port $1 did not become healthy" >&2
  return 1
}

sweep() {  # label, out dir, extra body, levels
  "$bin/quickdraft" bench-serve --url "http://127.0.0.1:$port/v1" --prompts "$prompts" --concurrency "${4:-$levels}" \
    --max-tokens "$tokens" --label "$1" --out "$out/$2" ${3:+--extra-body "$3"} ${requests:+--requests "$requests"}
}

"$bin/quickdraft" serve --model "$model" --threads "$threads" --max-batch "$max_batch" --max-queue 64 --port "$port" \
  ${step_tokens:+--step-tokens "$step_tokens"} ${drafter:+--drafter "$drafter"} > "$out/quickdraft-serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
wait_healthy "$port"
# The configurations, each measured on this one server: no speculation first (the combined report's ratios are
# the others' against it), the server's default drafters, then each of ALSO's drafters named in the request body.
names=(plain spec) labels=("quickdraft, no speculation" "quickdraft, speculation${drafter:+ ($drafter)}")
bodies=('{"quickdraft": {"drafter": "none"}}' "")
IFS=';' read -ra also_list <<< "$also"
for other in "${also_list[@]}"; do
  names+=("spec-${other//[^a-z0-9]/_}") labels+=("quickdraft, speculation ($other)")
  bodies+=("{\"quickdraft\": {\"drafter\": \"$other\"}}")
done
runs=()
IFS=, read -ra level_list <<< "$levels"
for round in $(seq 1 "$rounds"); do
  suffix=$([ "$round" = 1 ] && echo "" || echo "-$round")
  # A level at a time, the configurations back to back, which goes first rotating level by level and round by
  # round: a slow stretch of the machine then falls on all of them, not on one configuration's whole sweep.
  for i in "${!level_list[@]}"; do
    level=${level_list[$i]}
    for j in "${!names[@]}"; do
      c=$(((j + round + i) % ${#names[@]}))
      sweep "${labels[$c]}" "levels/${names[$c]}$suffix-c$level" "${bodies[$c]}" "$level"
    done
  done
  for c in "${!names[@]}"; do
    parts=()
    for level in "${level_list[@]}"; do parts+=("$out/levels/${names[$c]}$suffix-c$level/results.json"); done
    "$bin/quickdraft" bench-serve --merge "${parts[@]}" --out "$out/quickdraft-${names[$c]}$suffix"
    runs+=("$out/quickdraft-${names[$c]}$suffix/results.json")
  done
done
kill "$server"; wait "$server" 2>/dev/null || true

if [ -n "$llama_bin" ]; then
  gguf=$("$bin/python" -c "from quickdraft.models.registry import BUILTIN_MODELS; from quickdraft.models.store import cache_dir; print(cache_dir() / 'gguf' / BUILTIN_MODELS['$model'].gguf_filename)")
  for mode in plain ngram-simple; do  # llama-server plain and with its n-gram speculation: its best mode varies
    spec=()
    if [ "$mode" != plain ]; then spec=(--spec-type "$mode"); fi
    "$llama_bin/llama-server" -m "$gguf" -t "$threads" -np "$max_batch" -c $((max_batch * 4096)) --port "$port" \
      "${spec[@]}" "${llama_args[@]}" -fa off --jinja > "$out/llama-server-$mode.log" 2>&1 &
    server=$!
    wait_healthy "$port"
    # cache_prompt false: the sweep sends the same prompts at every level, and llama-server would answer them from
    # its prompt cache after the first level (quickdraft has no prompt cache): both then prefill every prompt.
    sweep "llama-server -np $max_batch $mode" "llama-server-$mode" '{"cache_prompt": false}'
    kill "$server"; wait "$server" 2>/dev/null || true
    runs+=("$out/llama-server-$mode/results.json")
  done
fi
"$bin/quickdraft" bench-serve --combine "${runs[@]}" --out "$out/combined"
