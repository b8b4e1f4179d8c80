"""Build a tiny Qwen3-style model that `vllm serve` loads, for the realvllm test tier.

Two layers, hidden size 128, 2 KV heads, random weights from a fixed seed, and a byte-level
BPE tokenizer trained here on generated text: nothing is downloaded, and the same inputs give
the same files. Run it with the vLLM venv's Python (it needs torch, transformers, tokenizers):

    .venv-vllm/bin/python scripts/make_tiny_model.py [OUT_DIR]    # default: .tiny-model
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

SEED = 20240601
VOCAB_SIZE = 512
EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS, "<|im_start|>", "<|im_end|>"]

# Words of the domain, so prompts about the project tokenize into a few pieces each.
DOMAIN_WORDS = (
    "the a of to and in is for on with by from at as that this it be are was were kv cache "
    "offload offloading tier tiers gpu cpu memory pinned host disk nvme prefix prefill token "
    "tokens request requests latency ttft itl p99 budget canary stable rollout rollback stage "
    "ladder replica replicas model serve vllm engine block blocks hit miss transfer recompute "
    "prometheus metric metrics scrape window verdict pass fail inconclusive operator kubernetes "
    "policy spec status hello world one two three four five six seven eight nine ten"
)
WORDS = DOMAIN_WORDS.split()


def training_text(rng: random.Random, lines: int = 4000) -> list[str]:
    """Sentences of random domain words, with digits and punctuation so every byte pattern appears."""
    out = []
    for _ in range(lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 16))]
        out.append(" ".join(words) + rng.choice([".", ",", "?", "!", ":", f" {rng.randint(0, 99999)}."]))
    return out


def build_tokenizer(rng: random.Random) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        # The whole byte alphabet, so any input text encodes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_text(rng), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=EOS)


def build_model(vocab_size: int, eos_id: int) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        # float32: every CPU runs it; bfloat16 needs AVX512-BF16 in vLLM's CPU kernels.
        dtype="float32",
    )
    torch.manual_seed(SEED)
    return Qwen3ForCausalLM(config).eval()


def main(out: Path) -> None:
    rng = random.Random(SEED)
    tokenizer = build_tokenizer(rng)
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    model = build_model(len(tokenizer), eos_id)
    model.generation_config = GenerationConfig(bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id)

    # Build beside the target and rename, so a half-written model never looks complete.
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    staging.chmod(0o755)
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    params = sum(p.numel() for p in model.parameters())
    print(f"make_tiny_model: {out} ({params:,} parameters, vocabulary {len(tokenizer)})")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ".tiny-model"))
