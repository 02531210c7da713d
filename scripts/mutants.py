"""Named mutants: deliberate bugs the test suite must catch, applied one at a time.

    python scripts/mutants.py            # every mutant (what `make mutants` runs)
    python scripts/mutants.py --list     # their names
    python scripts/mutants.py rollback-off-by-one ngram-proposal-shifted-by-one

Each mutant replaces one exact piece of code (which must occur exactly once, so a mutant whose code
has moved fails loudly instead of testing nothing) in a copy of the checkout, then runs the tests
that guard that promise, stopping at the first failure. First, every selection of tests runs once on
the unmutated copy and must pass: a mutant is killed only when a test *fails* with it (pytest's exit
status 1), never by a test that cannot run at all. One that survives is a missing test. Exit status
1 when any survives. `docs/testing.md` says which test guards which promise.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # file to change, relative to the checkout
    before: str  # the exact code replaced (must occur once)
    after: str
    tests: tuple[str, ...]  # pytest arguments: the tests that must fail


MUTANTS = [
    Mutant(
        "rollback-off-by-one",
        "quickdraft/running.py",
        "return committed_length + 1 + verdict.num_accepted",
        "return committed_length + verdict.num_accepted",
        ("tests/test_exactness.py", "-k", "cache_free"),
    ),
    Mutant(
        "residual-from-the-wrong-row",
        "quickdraft/verify.py",
        "residual_distribution(row, draft_probs[i])",
        "residual_distribution(row, draft_probs[max(i - 1, 0)])",
        ("tests/test_verify.py", "tests/test_exactness.py", "-k", "residual or sampled or law"),
    ),
    Mutant(
        "draft-probs-left-unwarped",
        "quickdraft/drafters/draft_model.py",
        "rows.append(probs)",
        "rows.append(torch.softmax(self._fit_vocab(logits), -1))",
        ("tests/test_exactness.py", "-k", "sampled"),
    ),
    Mutant(
        "kv-write-one-position-late",
        "quickdraft/models/native/runner.py",
        "seq.cache.write(i, seq.start, keys[seq.rows], values[seq.rows])",
        "seq.cache.write(i, seq.start + 1, keys[seq.rows], values[seq.rows])",
        ("tests/test_batch_runtime.py", "-k", "cpp_decoder"),
    ),
    Mutant(
        "prompt-rows-see-their-whole-chunk",
        "quickdraft/models/native/runner.py",
        "torch.tensor([p + 1 for p in positions], dtype=torch.long),",
        "torch.tensor([max(positions) + 1 if alone[0].prompt else p + 1 for p in positions], dtype=torch.long),",
        ("tests/test_native_runtime.py", "-k", "prefill_matches_transformers"),
    ),
    Mutant(
        "decoder-reads-every-layer-through-the-first-window",
        "quickdraft/models/native/kernels/decoder.cpp",
        "forward.begins.at(layer.window_slot)",
        "forward.begins.at(0)",
        ("tests/test_batch_runtime.py", "-k", "cpp_decoder and gemma3"),
    ),
    Mutant(
        "prompt-block-mask-keeps-one-key-past-the-window",
        "quickdraft/models/native/layers.py",
        "blocked |= key_pos <= query_pos - window",
        "blocked |= key_pos < query_pos - window",
        ("tests/test_devices.py", "-k", "prompt_blocks_attend"),
    ),
    Mutant(
        "decoder-writes-keys-one-position-late",
        "quickdraft/models/native/kernels/decoder.cpp",
        "write_positions(layer_keys.back(), forward.starts[s], new_keys, row, count)",
        "write_positions(layer_keys.back(), forward.starts[s] + 1, new_keys, row, count)",
        ("tests/test_exactness.py", "-k", "cache_free and native"),
    ),
    Mutant(
        "head-pairs-fed-together-see-the-later-ones",
        "quickdraft/models/native/kernels/decoder.cpp",
        "at::arange(start + 1, start + n + 1, options)",
        "at::full({n}, start + n, options)",
        ("tests/test_head.py", "-k", "inference_form"),
    ),
    Mutant(
        "decoder-skips-the-post-mlp-norm",
        "quickdraft/models/native/kernels/decoder.cpp",
        "if (layer.post_mlp_norm.defined()) out",
        "if (false) out",
        ("tests/test_batch_runtime.py", "-k", "cpp_decoder and gemma3"),
    ),
    Mutant(
        "batched-verdicts-swapped",
        "quickdraft/engine.py",
        "zip(decodes, outputs[len(prefills) :])",
        "zip(decodes, outputs[len(prefills) :][::-1])",
        ("tests/test_batch_engine.py", "-k", "solo_greedy and llama and int8"),
    ),
    Mutant(
        "batched-sequence-reads-the-first-slot",
        "quickdraft/models/native/runner.py",
        "cache, n = self._slots[step.slot], len(step.token_ids)",
        "cache, n = self._slots[steps[0].slot], len(step.token_ids)",
        ("tests/test_batch_runtime.py",),
    ),
    Mutant(
        "eos-ignored-inside-an-accepted-draft",
        "quickdraft/output.py",
        "            if token in self._eos:\n",
        "            if token in self._eos and token == tokens[-1]:\n",
        ("tests/test_exactness.py", "tests/test_engine.py", "-k", "eos"),
    ),
    Mutant(
        "sliding-window-one-too-wide",
        "quickdraft/models/native/layers.py",
        "max(0, position - window + 1)",
        "max(0, position - window)",
        ("tests/test_native_runtime.py", "tests/test_exactness.py", "-k", "window or gemma3"),
    ),
    Mutant(
        "ngram-proposal-shifted-by-one",
        "quickdraft/drafters/ngram.py",
        "context_ids[start + n : start + n + k]",
        "context_ids[start + n + 1 : start + n + k + 1]",
        ("tests/test_drafters.py",),
    ),
    Mutant(
        "head-vocabulary-map-off-by-one",
        "quickdraft/drafters/head/drafter.py",
        "return int(self.vocab_ids[argmax(logits)]), None",
        "return int(self.vocab_ids[(argmax(logits) + 1) % len(self.vocab_ids)]), None",
        ("tests/test_head.py", "-k", "vocabulary_map"),
    ),
    Mutant(
        "head-sampled-draw-mapped-to-the-next-id",
        "quickdraft/drafters/head/drafter.py",
        "return int(self.vocab_ids[drawn]), probs",
        "return int(self.vocab_ids[(drawn + 1) % len(self.vocab_ids)]), probs",
        ("tests/test_head.py", "-k", "distribution_they_carry"),
    ),
    Mutant(
        "training-time-test-reads-its-own-position",
        "quickdraft/drafters/head/model.py",
        "inputs = F.pad(out[:, :-1], (0, 0, 1, 0))",
        "inputs = out",
        ("tests/test_head.py", "-k", "unrolled_training"),
    ),
    Mutant(
        "exported-d2t-offsets-negated",
        "quickdraft/drafters/head/files.py",
        'tensors["d2t"] = (ids - torch.arange(len(ids))).to(torch.int64)',
        'tensors["d2t"] = (torch.arange(len(ids)) - ids).to(torch.int64)',
        ("tests/test_head.py", "-k", "exported_head_loads_back"),
    ),
    Mutant(
        "accepted-drafts-credited-to-the-target",
        "quickdraft/running.py",
        "accepted = (decode.plan.drafter,) * verdict.num_accepted",
        "accepted = (TARGET,) * verdict.num_accepted",
        ("tests/test_engine.py", "-k", "proposed_it or span_counts"),
    ),
    Mutant(
        "verification-query-reads-keys-before-its-window",
        "quickdraft/models/native/runner.py",
        "torch.tensor([key_begin(p, window) for p in positions], dtype=torch.long),",
        "torch.tensor([0 for p in positions], dtype=torch.long),",
        ("tests/test_native_runtime.py", "tests/test_exactness.py", "-k", "window or gemma3"),
    ),
    Mutant(
        "four-bit-product-drops-the-offset-term",
        "quickdraft/models/native/kernels/blocks.cpp",
        "acc[r] = _mm256_fmadd_ps(offsets, _mm256_set1_ps(x.sum[at]), acc[r]);",
        "acc[r] = acc[r];",
        ("tests/test_kernels.py", "tests/test_gguf_runtime.py", "-k", "product or exact_weights"),
    ),
    Mutant(
        "four-bit-product-sums-multi-row-passes-in-another-order",
        "quickdraft/models/native/kernels/blocks.cpp",
        "acc[r] = _mm256_fmadd_ps(dots, _mm256_mul_ps(scales, _mm256_set1_ps(x.scale[at])), acc[r]);",
        "acc[r] = R > 1 ? _mm256_add_ps(acc[r], _mm256_mul_ps(dots, _mm256_mul_ps(scales, "
        "_mm256_set1_ps(x.scale[at])))) "
        ": _mm256_fmadd_ps(dots, _mm256_mul_ps(scales, _mm256_set1_ps(x.scale[at])), acc[r]);",
        ("tests/test_kernels.py", "-k", "same_bits"),
    ),
    Mutant(
        "attention-row-reads-the-first-rows-sequence",
        "quickdraft/models/native/kernels/blocks.cpp",
        "const int64_t s = sequence[row0], n = count * width;",
        "const int64_t s = sequence[0], n = count * width;",
        ("tests/test_batch_runtime.py", "-k", "equal_each_sequence_alone"),
    ),
    Mutant(
        "attention-head-part-reads-the-first-parts-queries",
        "quickdraft/models/native/kernels/blocks.cpp",
        "const T* q_row = q_all + ((row0 + r) * heads + kv * group + g0 + g) * head_dim;",
        "const T* q_row = q_all + ((row0 + r) * heads + kv * group + g) * head_dim;",
        ("tests/test_kernels.py", "-k", "attention"),
    ),
    Mutant(
        "argmax-takes-a-later-tie-within-a-vector",
        "quickdraft/models/native/kernels/blocks.cpp",
        "if (equal != 0) return i + __builtin_ctz(static_cast<unsigned>(equal));",
        "if (equal != 0) return i + 31 - __builtin_clz(static_cast<unsigned>(equal));",
        ("tests/test_kernels.py", "-k", "argmax"),
    ),
    Mutant(
        "argmax-each-reads-the-first-tensors-rows",
        "quickdraft/models/native/kernels/blocks.cpp",
        "for (int64_t r = 0; r < x.size(0); ++r) rows.emplace_back(static_cast<int64_t>(i), r);",
        "for (int64_t r = 0; r < x.size(0); ++r) rows.emplace_back(0, r);",
        ("tests/test_kernels.py", "-k", "argmax"),
    ),
    Mutant(
        "greedy-verification-takes-another-requests-argmax",
        "quickdraft/engine.py",
        "greedy_ids = iter(argmax_each([out.logits for (request, _), out in verified if request.params.greedy]))",
        "greedy_ids = iter(argmax_each([out.logits for (request, _), out in verified if request.params.greedy])[::-1])",
        ("tests/test_batch_engine.py", "-k", "solo_greedy and llama and int8"),
    ),
    Mutant(
        "rope-table-from-torchs-float32-cos",
        "quickdraft/models/native/rope.py",
        "cos = torch.from_numpy(np.cos(angles)).float() * freqs.attention_scaling",
        "cos = torch.from_numpy(angles).float().cos() * freqs.attention_scaling",
        ("tests/test_native_runtime.py", "-k", "rope_tables"),
    ),
    Mutant(
        "attention-row-weighs-its-block-neighbours-positions",
        "quickdraft/models/native/kernels/blocks.cpp",
        "const int64_t first = std::max(t, begin[j]), last = std::min(t + n, end[j]);",
        "const int64_t first = std::max(t, begin[0]), last = std::min(t + n, end[j]);",
        ("tests/test_kernels.py", "-k", "attention"),
    ),
    Mutant(
        "attention-value-pass-shares-queries-with-other-positions",
        "quickdraft/models/native/kernels/blocks.cpp",
        "std::min(t + n, end[j + together]) == last) {",
        "std::min(t + n, end[j + together]) >= first) {",
        ("tests/test_kernels.py", "-k", "attention"),
    ),
    Mutant(
        "prefill-shortest-first-without-aging",
        "quickdraft/running.py",
        "return len(self.output.prompt_ids) - self.prefilled - step_tokens * self.prefill_steps",
        "return len(self.output.prompt_ids) - self.prefilled",
        ("tests/test_batch_engine.py", "-k", "hold_a_long_prompt_back"),
    ),
    Mutant(
        "corpus-chain-keeps-its-first-context",
        "quickdraft/drafters/corpus.py",
        "tail = [*tail, token][-self.max_order :]",
        "tail = tail",
        ("tests/test_corpus.py", "-k", "chains"),
    ),
    Mutant(
        "corpus-counts-prompt-tokens-as-answers",
        "quickdraft/drafters/corpus.py",
        "for position in range(max(answer_start, 1), len(tokens)):",
        "for position in range(1, len(tokens)):",
        ("tests/test_corpus.py", "-k", "most_frequent"),
    ),
    Mutant(
        "categorical-draw-ignores-the-row-total",
        "quickdraft/categorical.py",
        "point = torch.minimum(uniform[:, None] * total, below_total)",
        "point = torch.minimum(uniform[:, None], below_total)",
        ("tests/test_sampling.py", "-k", "draws_follow"),
    ),
    Mutant(
        "draw-kernel-forgets-the-blocks-before",
        "quickdraft/models/native/kernels/draw.cpp",
        "const double rest = point - (b > 0 ? running[b - 1] : 0.0);",
        "const double rest = point;",
        ("tests/test_kernels.py", "tests/test_sampling.py", "-k", "draw"),
    ),
    Mutant(
        "softmax-kernel-keeps-removed-tokens",
        "quickdraft/models/native/kernels/blocks.cpp",
        "return _mm256_andnot_ps(removed, exp_nonpositive(_mm256_sub_ps(_mm256_mul_ps(values, scale), shift)));",
        "return exp_nonpositive(_mm256_sub_ps(_mm256_mul_ps(values, scale), shift));",
        ("tests/test_kernels.py", "-k", "softmax"),
    ),
    Mutant(
        "prefill-in-arrival-order",
        "quickdraft/running.py",
        "return len(self.output.prompt_ids) - self.prefilled - step_tokens * self.prefill_steps",
        "return 0",
        ("tests/test_batch_engine.py", "-k", "short_prompt_gets_its_first_token"),
    ),
    Mutant(
        "gpu-row-tiles-left-unpadded",
        "quickdraft/models/native/weights.py",
        "padded = F.pad(x, (0, 0, 0, -n % self.row_tile))",
        "padded = x",
        ("tests/test_devices.py", "-k", "row_tiles or verification_rows"),
    ),
]


def copy_checkout(destination: Path) -> None:
    """The files git tracks, plus untracked ones it does not ignore, as they are in the working tree."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True
    )
    for relative in listed.stdout.splitlines():
        source = ROOT / relative
        if source.is_file():
            (destination / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / relative)


def pytest_run(copy: Path, tests: tuple[str, ...]) -> subprocess.CompletedProcess:
    """pytest on `tests` in the copy (its own package, not the installed checkout), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
        cwd=copy,
        env={**os.environ, "PYTHONPATH": str(copy)},
        capture_output=True,
        text=True,
    )


def check_controls(mutants: list[Mutant]) -> None:
    """Every selection of tests passes on the unmutated checkout (else a 'kill' would mean nothing)."""
    with tempfile.TemporaryDirectory(prefix="mutant-control-") as scratch:
        copy_checkout(Path(scratch))
        for tests in dict.fromkeys(mutant.tests for mutant in mutants):
            if (result := pytest_run(Path(scratch), tests)).returncode != 0:
                print(result.stdout[-4000:], result.stderr[-2000:], sep="\n", file=sys.stderr)
                sys.exit(f"without any mutant, pytest {' '.join(tests)} exits {result.returncode}; fix that first")


def run(mutant: Mutant) -> tuple[bool, float]:
    """(killed, seconds) for one mutant, tested in a fresh copy of the checkout."""
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as scratch:
        copy = Path(scratch)
        copy_checkout(copy)
        target = copy / mutant.path
        source = target.read_text()
        if (count := source.count(mutant.before)) != 1:
            sys.exit(f"mutant {mutant.name}: {mutant.path} holds its code {count} times; update the mutant")
        target.write_text(source.replace(mutant.before, mutant.after))
        started = time.perf_counter()
        status = pytest_run(copy, mutant.tests).returncode
        if status not in (0, 1):
            sys.exit(f"mutant {mutant.name}: pytest exits {status}, not a test failure; fix the mutant or its tests")
        return status == 1, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="print the mutants' names and exit")
    args = parser.parse_args()
    by_name = {mutant.name: mutant for mutant in MUTANTS}
    if args.list:
        print("\n".join(by_name))
        return 0
    if unknown := [name for name in args.names if name not in by_name]:
        parser.error(f"unknown mutants {', '.join(unknown)}; see --list")
    chosen = [by_name[name] for name in args.names] or MUTANTS
    check_controls(chosen)
    survivors = []
    for mutant in chosen:
        killed, seconds = run(mutant)
        print(f"{'killed  ' if killed else 'SURVIVED'} {mutant.name} ({seconds:.0f} s)", flush=True)
        if not killed:
            survivors.append(mutant.name)
    print(f"{len(survivors)} of {len(chosen)} mutants survived" + (": each is a missing test" if survivors else ""))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
