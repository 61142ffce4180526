"""Tiny checkpoints for the server tests: a byte-level BPE tokenizer and a random-weight Llama."""

from __future__ import annotations

import json
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 512
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! How are you today? I am fine, thank you.",
    "Large language models generate text one token at a time.",
    "Serving many clients at once needs continuous batching and a paged KV cache.",
    "Héllo wörld, ça va? Grüße aus München. 日本語のテキスト。",
    "def add(a, b):\n    return a + b\n",
]


def build_tokenizer(folder: Path, tokenizer_class: str = "PreTrainedTokenizerFast",
                    chat_template: str | None = CHATML_TEMPLATE) -> None:
    """Train a small byte-level BPE and save tokenizer.json + tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(CORPUS * 20, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": tokenizer_class, "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "bos_token": None, "model_max_length": 256}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def build_llama(folder: Path, max_position_embeddings: int = 256) -> None:
    """A 2-layer random-weight Llama (GQA) saved as safetensors, with the tokenizer beside it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    build_tokenizer(folder)
    vocab = json.loads((folder / "tokenizer.json").read_text())
    eos_id = next(t["id"] for t in vocab["added_tokens"] if t["content"] == "<|im_end|>")
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_position_embeddings,
        eos_token_id=eos_id, bos_token_id=None, pad_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(str(folder), safe_serialization=True)
