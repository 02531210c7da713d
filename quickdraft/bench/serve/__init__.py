"""`quickdraft bench-serve`: a bounded closed-loop load generator for any OpenAI-compatible chat endpoint.

client.py   one streamed chat request over httpx, its server-sent events read into a RequestResult
load.py     the run's config, the endpoint's model, the warm-up and the closed loop at each concurrency
summary.py  percentiles and the figures of a level: TTFT, TPOT, ITL, throughput, goodput, exactness
results.py  results.json: what a run writes and what --combine reads back
report.py   report.md and the stdout tables, of one run or of several runs side by side
plots.py    latency.png and throughput.png against concurrency, one line per run
"""
