"""`quickdraft bench`: Spec-Bench style measurements of speculative decoding against plain decoding.

dataset.py   load and validate a JSONL prompt file; select categories / first N per category
methods.py   one class per method (quickdraft engine with a drafter and k; transformers peers)
prediction.py  the speedup measured v(k), draft cost c and acceptance a predict
runner.py    the interleaved loop over repeats, prompts and methods; raw measurements
summary.py   aggregation of raw measurements (Spec-Bench speedups, spread over repeats)
report.py    report.md from a results dict
plots.py     PNG plots from a results dict
provenance.py  machine, versions, git commit, command line
runtime.py   `quickdraft bench-runtime`: decode tok/s and v(k) of the runners
adaptive.py  `quickdraft bench-adaptive`: --k auto against every fixed k (adaptive_report.py: its report)
replay.py    the engine re-decoding recorded outputs under a cost model, without timing noise
serve/       `quickdraft bench-serve`: a bounded load generator for any OpenAI-compatible chat endpoint
"""
