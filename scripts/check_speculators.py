"""Check an exported head against the `speculators` package's own EAGLE-3 model (issue #17, item 4).

`speculators` pins transformers and torch versions other than ours, so it lives in an environment of its
own that sees this project's packages through a .pth file and takes speculators itself without its pins:

    python3.11 -m venv /tmp/specvenv
    echo "$PWD/.venv/lib/python3.11/site-packages" > /tmp/specvenv/lib/python3.11/site-packages/quickdraft.pth
    /tmp/specvenv/bin/pip install --no-deps speculators==0.9.0
    /tmp/specvenv/bin/pip install loguru pydantic-settings "datasets<=5.1.0" hs-connectors
    PYTHONPATH=. /tmp/specvenv/bin/python scripts/check_speculators.py

It builds a tiny random Llama target, saves a random head for it with quickdraft, exports it with
`quickdraft distill export --format speculators`, and then:
1. parses config.json with speculators' `Eagle3SpeculatorConfig` (its field validation);
2. loads the directory with `Eagle3DraftModel.from_pretrained` (every tensor name and shape must match;
   the verifier's layer ids are resolved against the target's config);
3. runs speculators' forward (one drafting step, eager attention) on the same target states and tokens as
   quickdraft's head and compares the draft logits, and maps the argmax through speculators' d2t.
It exits 1 on a mismatch and prints what it compared.
"""

import sys
import tempfile
from pathlib import Path

import torch

from quickdraft.cli import main as quickdraft_main
from quickdraft.drafters.head.files import build_head, load_head, save_head
from quickdraft.drafters.head.identity import target_identity
from quickdraft.drafters.head.model import HeadCache, HeadConfig
from quickdraft.models.loading import load_model_dir
from tests.tiny_models import llama_config, save_tiny_model

LENGTH = 24  # pairs fed in one forward


def main() -> int:
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    root = Path(tempfile.mkdtemp(prefix="check-speculators-"))
    target_dir = save_tiny_model(root / "target", llama_config(320, num_hidden_layers=8), seed=0)
    target = load_model_dir(target_dir, runtime="hf")
    torch.manual_seed(0)
    vocab_ids = torch.randperm(320)[:200].sort().values  # [draft_vocab]
    head = build_head(HeadConfig.like_target(target.config, len(vocab_ids)), target, vocab_ids)
    for parameter in head.parameters():
        torch.nn.init.normal_(parameter, std=0.3) if parameter.dim() > 1 else None
    save_head(root / "head", head, target_identity(target), verifier=str(target_dir), dtype=torch.float32)
    exported = root / "speculators"
    code = quickdraft_main(["distill", "export", str(root / "head"), "--format", "speculators", "--out", str(exported)])
    if code != 0:
        return code

    config = Eagle3SpeculatorConfig.from_pretrained(exported)
    print(
        f"Eagle3SpeculatorConfig: aux layers {config.eagle_aux_hidden_state_layer_ids}, "
        f"draft vocab {config.draft_vocab_size}, verifier {config.speculators_config.verifier.name_or_path}"
    )
    config.transformer_layer_config._attn_implementation = "eager"  # CPU; the default is flex attention
    theirs = Eagle3DraftModel.from_pretrained(exported, config=config, torch_dtype=torch.float32).eval()
    theirs.embed_tokens.weight.data.copy_(target.runner.embedding_matrices()[0].float())  # the verifier's, frozen
    ours = load_head(exported, target).eval()
    print(f"Eagle3DraftModel loaded; resolved aux layers {theirs.config.eagle_aux_hidden_state_layer_ids}")

    aux = torch.randn(1, LENGTH, len(ours.config.aux_layers) * ours.config.target_hidden_size)  # [1, T, 3d]
    tokens = torch.randint(0, 320, (1, LENGTH))  # [1, T]: x_{t+1} of each pair
    with torch.no_grad():
        our_logits = ours.draft_logits(ours.step(ours.fuse(aux[0]), tokens[0], HeadCache()))  # [T, draft_vocab]
        their_logits = _their_logits(theirs, aux, tokens)  # [T, draft_vocab]
    difference = float((our_logits - their_logits).abs().max())
    same_argmax = bool(torch.equal(our_logits.argmax(-1), their_logits.argmax(-1)))
    d2t = theirs.d2t if theirs.d2t is not None else torch.zeros(len(vocab_ids), dtype=torch.long)
    their_ids = their_logits.argmax(-1) + d2t[their_logits.argmax(-1)]
    same_ids = bool(torch.equal(their_ids, ours.vocab_ids[our_logits.argmax(-1)]))
    print(
        f"draft logits, {LENGTH} positions: max |ours - speculators'| {difference:.2e}, same argmax {same_argmax}, "
        f"same target ids through d2t {same_ids}"
    )
    return 0 if difference < 1e-3 and same_argmax and same_ids else 1


def _their_logits(model, aux: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """speculators' forward, one drafting step, without a verifier: the draft logits of every position."""
    captured = []
    handle = model.lm_head.register_forward_hook(lambda module, inputs, output: captured.append(output))
    model(hidden_states=aux, input_ids=tokens, document_ids=torch.zeros_like(tokens), ttt_steps=1)
    handle.remove()
    return captured[0][0]


if __name__ == "__main__":
    sys.exit(main())
