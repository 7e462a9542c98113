"""Make the tiny random-weight Llama the real-engine tests serve (no hub downloads).

Run with the ENGINE environment's python (it has torch, transformers and tokenizers):
`python tests/engine/tiny_model.py OUT_DIR`. Writes a Hugging Face model folder: a
2-layer Llama (hidden 256, 4 attention heads of 64, 2 KV heads, vocab 512; vLLM's CPU
attention kernel refuses a head size of 16) with seeded random weights, and a byte-level
BPE tokenizer trained here on a fixed text. Deterministic for a given library version.
The folder is written to OUT_DIR.tmp and renamed, so a half-written model is never used.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

VOCAB_SIZE = 512
MAX_POSITIONS = 2048
BOS, EOS, PAD = "<s>", "</s>", "<pad>"


def _corpus() -> list[str]:
    text = (
        "the governor scales engines when latency rises and batches requests to meet the "
        "service level objective while the scheduler admits sequences into the running set "
        "tokens prefill decode cache queue replica capacity model prompt output"
    )
    words = text.split(" ")
    return [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 8


def make(out: Path) -> None:
    """Write the model and tokenizer to `out` (atomically, via a temporary folder)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD
    )
    fast.save_pretrained(tmp)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_model.py OUT_DIR")
    make(Path(sys.argv[1]))
