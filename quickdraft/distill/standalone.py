"""`--kind standalone`: a small plain Llama with the target's full vocabulary and tokenizer.

It has the target's width and `LAYERS` decoder layers; its tied embedding starts from the target's
embedding and its final norm from the target's. It learns, at every answer position, the target's
full next-token distribution (softmax of the target's output layer times its final-norm state there,
`states.py`) by cross-entropy. The result is a standard transformers directory: usable as `assistant_model`, or
as `--drafter DIR` in quickdraft.
"""

import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from quickdraft.distill.data import Shard
from quickdraft.distill.states import ShardStates
from quickdraft.distill.train import Example, Trainer, make_batch, split_examples
from quickdraft.models.loading import LoadedModel, load_model, transformers_model

LAYERS = 2


def standalone_model(target: LoadedModel) -> LlamaForCausalLM:
    """A `LAYERS`-layer Llama shaped like the target's layers, embedding and final norm copied."""
    source = target.config.get_text_config()
    config = LlamaConfig(
        vocab_size=target.info.vocab_size,
        hidden_size=source.hidden_size,
        intermediate_size=source.intermediate_size,
        num_hidden_layers=LAYERS,
        num_attention_heads=source.num_attention_heads,
        num_key_value_heads=source.num_key_value_heads,
        head_dim=getattr(source, "head_dim", None),
        max_position_embeddings=target.info.max_context,
        rms_norm_eps=source.rms_norm_eps,
        tie_word_embeddings=True,
        bos_token_id=source.bos_token_id,
        eos_token_id=sorted(target.info.eos_token_ids),
        pad_token_id=getattr(source, "pad_token_id", None),
    )
    model = LlamaForCausalLM(config)
    embeddings, _ = target.runner.embedding_matrices()
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(embeddings.float())
        model.model.norm.weight.copy_(transformers_model(target).get_decoder().norm.weight.float())
    return model


class StandaloneObjective:
    """Cross-entropy from the target's full next-token distribution to the small model's."""

    def __init__(self, model: LlamaForCausalLM, target_output: torch.Tensor) -> None:
        self.model = model
        self.target_output = target_output.float()  # [vocab, d]

    def loss(self, examples: list[Example]) -> torch.Tensor:
        return self._losses(examples)[0]

    def _losses(self, examples: list[Example]) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean cross-entropy, top-1 agreement with the target) over answer positions."""
        batch = make_batch(examples)
        logits = self.model(input_ids=batch.tokens).logits  # [B, L, vocab]
        with torch.no_grad():
            target_probs = torch.softmax(batch.final @ self.target_output.T, -1)  # [B, L, vocab]
        valid = batch.mask.float()
        ce = -(target_probs * torch.log_softmax(logits, -1)).sum(-1)  # [B, L]
        agree = (logits.argmax(-1) == target_probs.argmax(-1)).float()
        count = valid.sum().clamp_min(1)
        return (ce * valid).sum() / count, (agree * valid).sum() / count

    @torch.no_grad()
    def evaluate(self, examples: list[Example]) -> dict:
        self.model.eval()
        losses, agreements = (
            zip(*(self._losses(examples[i : i + 8]) for i in range(0, len(examples), 8)))
            if examples
            else ((0.0,), (0.0,))
        )
        return {"loss": float(sum(losses) / len(losses)), "top1_agreement": float(sum(agreements) / len(agreements))}


def train_standalone(target: LoadedModel, shards: list[Shard], states: list[ShardStates], options) -> Path:
    """Train and save the standalone draft under `options.out / "standalone"`; returns that directory."""
    model = standalone_model(load_model(options.target, runtime="hf"))  # its norm is read from the transformers model
    _, output = target.runner.embedding_matrices()
    train, heldout = split_examples(shards, states, options.training.train_on_prompts)
    trainer = Trainer(
        StandaloneObjective(model, output),
        train,
        heldout,
        options.training,
        options.out / "train" / "standalone.safetensors",
    )
    if options.resume:
        trainer.resume()
    metrics = trainer.run()
    directory = options.out / "standalone"
    model.save_pretrained(directory, safe_serialization=True)
    target.tokenizer.save_pretrained(directory)
    (directory / "README.md").write_text(
        f"# Standalone draft for {options.target}\n\n"
        f"{LAYERS}-layer Llama trained by `quickdraft distill --kind standalone` "
        f"on {sum(s.answer_tokens for s in shards)} self-generated answer tokens.\n"
        f"Held-out: {metrics}\n\n```\n{options.command}\n```\n"
    )
    print(f"distill: standalone draft written to {directory}: held-out {metrics}", file=sys.stderr)
    return directory
