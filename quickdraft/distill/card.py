"""The head's card: what it is for, how it was made, and what it measured, as Markdown."""

from dataclasses import asdict, dataclass

from quickdraft.distill.data import AnswerConfig, Shard
from quickdraft.distill.train import Example, TrainConfig
from quickdraft.distill.vocab import VocabChoice

WRITER_NUMBERS = {  # AnswerConfig.dtype, in words
    "float32": "float32",
    "bfloat16": "bfloat16",
    "int8": "bfloat16 with weights rounded to per-row int8, as the native int8 runtime",
}


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
    command: str
    parameters: int
    init_head: str | None = None  # the head training started from, if not a fresh one


def data_facts(shards: list[Shard], train: list[Example], heldout: list[Example]) -> dict:
    return {
        "shards": len(shards),
        "sequences": sum(len(s.lengths) for s in shards),
        "answer_tokens": sum(s.answer_tokens for s in shards),
        "all_tokens": sum(int(s.lengths.sum()) for s in shards),
        "train_sequences": len(train),
        "heldout_sequences": len(heldout),
    }


def render(facts: Facts) -> str:
    data, engine, heldout, baseline = facts.data, facts.engine, facts.heldout, facts.baseline
    start = "starting head" if facts.init_head else "untrained head"
    k = heldout["k"]
    lines = [
        f"# Draft head for {facts.target}",
        "",
        "An EAGLE-style draft head (Li et al. 2024): RMS-normalised [target's last hidden state ; embedding of the",
        "next token], fused by one linear map, then one Llama-style decoder layer predicting the next hidden state;",
        f"draft logits are that state times the target's own (frozen) output rows for {len(facts.vocab.ids)} tokens.",
        f"{facts.parameters / 1e6:.2f}M trained parameters. Lossless: the engine verifies every draft token.",
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
        f"| held-out acceptance by position, teacher-forced | {_numbers(heldout['acceptance_by_position'])} |",
        f"| engine (default runtime), greedy, k={engine['k']}, {engine['prompts']} held-out prompts: tau "
        f"| {engine['tau']:.2f} |",
        f"| engine: alpha / accepted per step by position "
        f"| {engine['alpha']:.3f} / {_numbers(engine['accepted_per_step_by_position'])} |",
        f"| engine: speedup over the target alone (same process) "
        f"| {engine['speedup']:.2f}x, outputs identical: {engine['identical']} |",
        f"| c: head step (int8 form) / one-token target forward (medians) | {engine['cost_ratio']:.3f} |",
        "",
        "## Data",
        "",
        f"Self-distillation: the target's own greedy answers ({WRITER_NUMBERS[facts.generation.dtype]}, "
        f"at most {facts.generation.max_new_tokens} tokens) to",
        f"training prompts of at most {facts.generation.max_prompt_tokens} tokens, "
        "with its post-norm last hidden state at every position. "
        f"{data['sequences']} sequences in {data['shards']} shards: {data['answer_tokens']} answer tokens",
        f"({data['all_tokens']} with prompts); held-out split {data['heldout_sequences']} sequences "
        "(prompt index % 20 == 0).",
        f"Reduced vocabulary: {len(facts.vocab.ids)} tokens ranked by frequency in the training split's answers "
        "(prompts rank",
        "the rest, see vocab.py); coverage of answer",
        f"tokens {facts.vocab.train_coverage:.2%} (training split), "
        f"{facts.vocab.heldout_coverage:.2%} (held-out split).",
        "",
        "## Training",
        "",
        f"Loss per drafting step s = 1..{facts.training.unroll} "
        "(the head fed its own predicted states, attending to true",
        "states for earlier context): smooth-L1(predicted state, true state) "
        f"+ {facts.training.ce_weight} x cross-entropy from",
        "the target's next-token distribution (renormalised over the reduced vocabulary) to the head's; steps weighted",
        f"equally. {facts.train_seconds / 60:.1f} min of training. Settings: `{asdict(facts.training)}`.",
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
