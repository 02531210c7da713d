"""`quickdraft bench-adaptive`: k="auto" against the target alone and every fixed k, side by side.

Two cases. In each, every prompt is generated with every setting, greedy, in one process, interleaved
(`measure.interleave`: the order of the settings rotates from prompt to prompt and round to round).

- safety: a drafter that cannot help, a random-weight draft model built from the target's own
  config (fewer layers) and tokenizer. Goal: auto >= 0.95x the target alone, where a fixed k = 4
  is clearly slower.
- quality: the ngram drafter (or several drafters, `--drafters ngram,head`) on the dev prompts,
  per category. Each drafter runs alone at every fixed k; auto chooses among all of them per step.
  Goal: auto >= 0.95x the best fixed setting of each category (chosen in hindsight), and faster
  than every single fixed setting overall.

With `repeats` > 1 every prompt is run that many rounds (the rotation shifts each round) and each
(prompt, setting) keeps its median time. Tokens per second of a setting = its generated tokens /
its time (prefill included), summed over the prompts of a category (or of the case), by two clocks:
wall time, what a user waits, and the process's CPU time, which other processes' load on a shared
machine does not inflate (with N torch threads busy it runs about N times the wall clock, so the
speedups by the two clocks agree when the machine is otherwise idle). Every setting must produce
the same tokens as the target alone; the report says so or lists the generations where it did not.
"""

import json
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from quickdraft.bench.dataset import Prompt
from quickdraft.config import DType, Runtime, SamplingParams, SpecConfig
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.engine import Engine
from quickdraft.measure import Generation, Trial, interleave, measure
from quickdraft.models.loading import LoadedModel, load_model_dir

TARGET = "target"
AUTO = "auto"
WARMUP_TOKENS = 4
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


@dataclass(frozen=True)
class Setting:
    label: str  # "target", "k=4" (or "ngram k=4" when several drafters are compared), "auto"
    spec: SpecConfig


def settings(drafters: list[str], ks: list[int], k_max: int) -> list[Setting]:
    """Target alone, each drafter alone at each fixed k, and auto choosing among all the drafters."""
    several = len(drafters) > 1
    fixed = [
        Setting(f"{drafter} k={k}" if several else f"k={k}", SpecConfig(drafter=drafter, k=k))
        for drafter in drafters
        for k in ks
    ]
    auto = Setting(AUTO, SpecConfig(drafter=",".join(drafters), k="auto", k_max=k_max))
    return [Setting(TARGET, SpecConfig(drafter="none", k=0)), *fixed, auto]


def random_draft_dir(target_dir: Path, out_dir: Path, layers: int, seed: int = 0) -> Path:
    """A random-weight model with the target's config cut to `layers` layers, and the target's tokenizer."""
    directory = Path(out_dir) / f"{Path(target_dir).name}-random-{layers}-layers-seed-{seed}"
    if (directory / "config.json").exists():
        return directory
    config = AutoConfig.from_pretrained(target_dir)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(directory, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (Path(target_dir) / name).exists():
            shutil.copy(Path(target_dir) / name, directory / name)
    return directory


def add_random_draft(engine: Engine, draft_dir: Path, name: str, runtime: Runtime, dtype: DType) -> None:
    draft: LoadedModel = load_model_dir(draft_dir, runtime=runtime, dtype=dtype, name=name)
    engine.add_drafter(name, DraftModelDrafter(draft.runner, engine.target.info.vocab_size, name))


def run_case(
    engine: Engine,
    case: str,
    prompts: list[Prompt],
    settings_: list[Setting],
    max_new_tokens: int,
    repeats: int = 1,
    log=print,
) -> list[Trial]:
    """Every prompt with every setting, `repeats` rounds, interleaved (`measure.interleave`)."""
    chat = bool(engine.target.tokenizer.chat_template)  # a base model without a template sees plain text
    prompt_ids = [engine.encode(p.first_turn, chat=chat) for p in prompts]
    _warm_up(engine, prompt_ids[0], settings_)
    specs = {setting.label: setting.spec for setting in settings_}
    params = SamplingParams(max_new_tokens=max_new_tokens)

    def report(trial: Trial) -> None:
        log(
            f"{case} r{trial.repeat + 1} {trial.prompt + 1}/{len(prompts)} {trial.category:<14} "
            f"{trial.method:<7} {trial.generation.tokens_per_second:6.2f} tok/s"
        )

    return interleave(
        list(specs),
        [p.category for p in prompts],
        repeats,
        lambda label, index, _: measure(engine, prompt_ids[index], params, specs[label]),
        on_trial=report,
    )


def _warm_up(engine: Engine, prompt_ids: list[int], settings_: list[Setting]) -> None:
    """One short untimed run per setting (first-call costs, calibration); auto's acceptance memory is then cleared."""
    for setting in settings_:
        engine.generate(prompt_ids, SamplingParams(max_new_tokens=WARMUP_TOKENS), spec=setting.spec)
    engine.calibrate(settings_[-1].spec).acceptance.clear()


def speeds(trials: list[Trial], clock: str = "wall") -> dict[str, dict[str, float]]:
    """Tokens per second by category (and "overall") and setting: summed tokens / summed median seconds.

    clock: "wall" or "cpu".
    """
    rounds: dict[tuple[str, int, str], list[Generation]] = {}
    for t in trials:
        rounds.setdefault((t.category, t.prompt, t.method), []).append(t.generation)
    totals: dict[tuple[str, str], list[float]] = {}
    for (category, _, setting), runs in rounds.items():
        seconds = statistics.median(g.wall_seconds if clock == "wall" else g.cpu_seconds for g in runs)
        for group in (category, "overall"):
            tokens_seconds = totals.setdefault((group, setting), [0.0, 0.0])
            tokens_seconds[0] += runs[0].new_tokens
            tokens_seconds[1] += seconds
    result: dict[str, dict[str, float]] = {}
    for (group, setting), (tokens, seconds) in totals.items():
        result.setdefault(group, {})[setting] = tokens / seconds
    return result


def mismatches(trials: list[Trial]) -> list[str]:
    """'category #prompt setting' for each generation whose tokens differ from the target alone's."""
    expected = {(t.prompt, t.repeat): t.generation.token_ids for t in trials if t.method == TARGET}
    return [
        f"{t.category} #{t.prompt} {t.method}" for t in trials if t.generation.token_ids != expected[t.prompt, t.repeat]
    ]


def adaptation(trials: list[Trial]) -> dict[str, float]:
    """How auto behaved: drafting steps before its first plain step in its first (cold) request, and overall shares."""
    runs = [t.generation for t in trials if t.method == AUTO]
    first = list(runs[0].k_per_step)
    steps = [k for g in runs for k in g.k_per_step]
    return {
        "cold_steps_before_first_plain_step": first.index(0) if 0 in first else len(first),
        "cold_drafting_steps": sum(k > 0 for k in first),
        "cold_steps": len(first),
        "drafting_share": sum(k > 0 for k in steps) / len(steps),
        "mean_k": sum(steps) / len(steps),
    }


def cost_profile(engine: Engine, spec: SpecConfig) -> dict:
    """The engine's cost model now: t(1) in ms, "v": v(k) = t(k + 1) / t(1) for k = 0.., and model drafters'
    cost per token / t(1) (c)."""
    memory = engine.calibrate(spec)
    t1 = memory.target.seconds(1)
    return {
        "t1_ms": 1000 * t1,
        "v": [memory.target.seconds(n) / t1 for n in range(1, memory.target.max_tokens + 1)],
        "draft_per_token_vs_t1": {name: memory.draft_seconds(name, 1) / t1 for name in memory.draft_costs},
    }


def same_work_timing(trials: list[Trial], reference: str) -> dict:
    """Timing noise, measured: auto's generations that chose exactly `reference`'s k at every step (same
    prompt and round), so both did the same work, and auto's tokens/s on them relative to `reference`'s.
    A prompt answered with end-of-sequence at once (no new tokens) has no speed to compare and is skipped."""
    runs = {(t.prompt, t.repeat, t.method): t.generation for t in trials}
    autos = [t for t in trials if t.method == AUTO and t.generation.new_tokens > 0]
    ratios = [
        t.generation.tokens_per_second / other.tokens_per_second
        for t in autos
        if (other := runs.get((t.prompt, t.repeat, reference))) is not None
        and t.generation.k_per_step == other.k_per_step
    ]
    spread = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)} if ratios else {}
    return {"reference": reference, "generations": len(ratios), "of": len(autos), **spread}


def save_raw(trials: dict[str, list[Trial]], path: Path) -> None:
    """Every case's trials, {case: [trial records]}."""
    path.write_text(json.dumps({case: [t.to_dict() for t in case_trials] for case, case_trials in trials.items()}))


def load_raw(path: Path) -> dict[str, list[Trial]]:
    """The trials `save_raw` wrote, by case."""
    return {case: [Trial.from_dict(r) for r in records] for case, records in json.loads(Path(path).read_text()).items()}
