"""The head's card: what it is for, how it was made, and what it measured, as Markdown."""

from dataclasses import asdict, dataclass

from quickdraft.distill.data import AnswerConfig, Shard
from quickdraft.distill.train import Example, TrainConfig, bfloat16_products
from quickdraft.distill.vocab import VocabChoice
from quickdraft.models.base import matrix_forms
from quickdraft.models.loading import LoadedModel


@dataclass(frozen=True)
class Facts:
    target: str
    identity: dict
    data: dict  # see data_facts
    vocab: VocabChoice
    generation: AnswerConfig
    training: TrainConfig
    train_seconds: float  # training time summed over resumed runs
    total_seconds: float  # wall time of the final invocation
    heldout: dict  # teacher-forced held-out metrics of the trained head (train.evaluate)
    baseline: dict  # the same for the head training started from (init_head), or an untrained one
    engine: dict  # evaluation.engine_metrics
    aux_layers: tuple[int, ...]  # the target states the head fuses
    runtime: str  # the target's runtime and dtype that wrote the answers and the states (e.g. "native gguf")
    data_seconds: float  # the engine's time writing the answers, summed over the shards (and resumed runs)
    states_seconds: float | None  # the time recomputing the shards' states (states.states_seconds), if recorded
    command: str
    parameters: int
    init_head: str | None = None  # the head training started from, if not a fresh one


def data_facts(shards: list[Shard], files: list[str], train: list[Example], heldout: list[Example]) -> dict:
    return {
        "shards": len(shards),
        "files": f"{files[0]} to {files[-1]}" if len(files) > 1 else files[0],
        "sequences": sum(len(s.lengths) for s in shards),
        "answer_tokens": sum(s.answer_tokens for s in shards),
        "all_tokens": sum(int(s.lengths.sum()) for s in shards),
        "sampled_answer_tokens": sum(s.answer_tokens for s in shards if s.answer_pass > 0),
        "sampled_passes": max(s.answer_pass for s in shards),
        "train_sequences": len(train),
        "heldout_sequences": len(heldout),
    }


def runtime_words(target: LoadedModel) -> str:
    """e.g. "NativeRunner in bfloat16, matrices int4 120, int8 1": how the target computed."""
    matrices = ", ".join(f"{form} {count}" for form, count in matrix_forms(target.runner).items())
    return f"{type(target.runner).__name__} in {str(target.runner.dtype).removeprefix('torch.')}" + (
        f", matrices {matrices}" if matrices else ""
    )


def render(facts: Facts) -> str:
    data, engine, heldout, baseline = facts.data, facts.engine, facts.heldout, facts.baseline
    start = "starting head" if facts.init_head else "untrained head"
    products = "bfloat16 (autocast)" if bfloat16_products(facts.training.precision) else "float32"
    k = heldout["k"]
    lines = [
        f"# Draft head for {facts.target}",
        "",
        "An EAGLE-3 draft head (Li et al. 2025): the target's states from layers "
        f"{', '.join(str(i) for i in facts.aux_layers)} (what each of those layers reads) fused by one linear map,",
        "then one Llama-style decoder layer over [normed embedding of the next token ; normed stream], its own output",
        f"fed back to draft further; draft logits over a reduced vocabulary of {len(facts.vocab.ids)} tokens.",
        f"{facts.parameters / 1e6:.2f}M trained parameters. Lossless: the engine verifies every draft token.",
        "Stored in the speculators layout vLLM loads (`quickdraft distill export` also writes the EAGLE-3 layout).",
        "",
        f'Use: `quickdraft generate --model {facts.target} --drafter head:DIR --chat "..."`',
        "",
        "## Measured",
        "",
        "| metric | value |",
        "| --- | --- |",
        f"| held-out tau@{k}, teacher-forced ({heldout['drafts']} draft starts) "
        f"| {heldout['tau']:.2f} ({start}: {baseline['tau']:.2f}) |",
        f"| held-out alpha, teacher-forced | {heldout['alpha']:.3f} ({start}: {baseline['alpha']:.3f}) |",
        f"| held-out acceptance at draft position 1..{k}, each given the one before, teacher-forced "
        f"| {_numbers(heldout['acceptance_by_position'])} |",
        f"| engine (default runtime), greedy, k={engine['k']}, {engine['prompts']} held-out prompts: tau "
        f"| {engine['tau']:.2f} |",
        f"| engine: alpha / accepted per step by position "
        f"| {engine['alpha']:.3f} / {_numbers(engine['accepted_per_step_by_position'])} |",
        f"| engine: speedup over the target alone (same process) "
        f"| {engine['speedup']:.2f}x, outputs identical: {engine['identical']} |",
        f"| c: head step (4-bit group form) / one-token target forward (medians) | {engine['cost_ratio']:.3f} |",
        "",
        "## Data",
        "",
        f"Self-distillation: the target's own greedy answers ({facts.runtime}, written by the batched engine, "
        f"at most {facts.generation.max_new_tokens} tokens) to",
        f"training prompts of at most {facts.generation.max_prompt_tokens} tokens, stored as token shards; "
        "the target's states recomputed from them by batched forwards. "
        f"{data['sequences']} sequences in {data['shards']} shards ({data['files']}): "
        f"{data['answer_tokens']} answer tokens",
        f"({data['all_tokens']} with prompts); held-out split {data['heldout_sequences']} sequences "
        "(prompt index % 20 == 0, greedy answers only).",
        *(
            [
                f"{data['sampled_answer_tokens']} of the answer tokens come from {data['sampled_passes']} further "
                f"pass(es) over the prompts, sampled at temperature {facts.generation.resample_temperature} "
                "(one seed per pass and prompt) once every prompt had its greedy answer."
            ]
            if data["sampled_passes"]
            else []
        ),
        f"Reduced vocabulary: {len(facts.vocab.ids)} tokens ranked by frequency in the training split's answers "
        "(prompts rank",
        "the rest, see vocab.py); coverage of answer",
        f"tokens {facts.vocab.train_coverage:.2%} (training split), "
        f"{facts.vocab.heldout_coverage:.2%} (held-out split).",
        "",
        *(
            [
                f"The engine wrote the answers in {facts.data_seconds / 60:.1f} min "
                f"({data['answer_tokens'] / facts.data_seconds:.0f} answer tokens/s)."
            ]
            if facts.data_seconds > 0
            else []
        ),
        *(
            [
                f"Their states were recomputed in {facts.states_seconds / 60:.1f} min "
                f"({data['all_tokens'] / facts.states_seconds:.0f} tokens/s, prompts included)."
            ]
            if facts.states_seconds
            else []
        ),
        "",
        "## Training",
        "",
        f"Training-time test: the head is unrolled on its own outputs for s = 1..{facts.training.unroll} drafting",
        "steps (attending to true states for the earlier context, true tokens throughout); the loss of step s is",
        "the cross-entropy from the target's next-token distribution (renormalised over the reduced vocabulary) to",
        f"the head's, weighted {facts.training.step_decay} ** (s - 1), at answer positions whose target token the",
        f"vocabulary holds. {facts.train_seconds / 60:.1f} min of training, its products in {products}. "
        f"Settings: `{asdict(facts.training)}`.",
        *(
            [
                f"Training started from the head in `{facts.init_head}` "
                "(weights and vocabulary; its own card tells how it was made)."
            ]
            if facts.init_head
            else []
        ),
        "",
        "## Command",
        "",
        f"```\n{facts.command}\n```",
        "",
    ]
    return "\n".join(lines)


def _numbers(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)
