"""Tiny random targets (with a byte-level BPE tokenizer and ChatML template) and prompt files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Speculative decoding drafts tokens and verifies them.",
         "def add(a, b):\n    return a + b\n", "Shall I compare thee to a summer's day?",
         "In the beginning God created the heaven and the earth."]


def build_target(folder: Path, model_type: str = "llama", hidden: int = 64, layers: int = 4, seed: int = 0) -> Path:
    """A random-weight target whose greedy output is not constant (small init, biased norms)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<mask>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TEXTS * 10, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "chat_template": CHATML}))
    cls = {"llama": "LlamaConfig", "qwen3": "Qwen3Config", "qwen2": "Qwen2Config"}[model_type]
    config = getattr(transformers, cls)(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, eos_token_id=2,
        bos_token_id=None, pad_token_id=0, tie_word_embeddings=True, head_dim=hidden // 4)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(str(folder))
    return folder


def write_prompts(path: Path, count: int = 24) -> Path:
    lines = []
    for i in range(count):
        text = TEXTS[i % len(TEXTS)]
        if i % 2:
            lines.append({"messages": [{"role": "user", "content": f"Continue: {text}"}], "type": "chat"})
        else:
            lines.append({"prompt": text[: 10 + i], "type": "text"})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    return build_target(tmp_path_factory.mktemp("targets") / "llama")


@pytest.fixture(scope="session")
def prompt_file(tmp_path_factory) -> Path:
    return write_prompts(tmp_path_factory.mktemp("prompts") / "prompts.jsonl")


@pytest.fixture(autouse=True)
def keep_torch_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # NOTE: tiny matmuls; 2 threads on a loaded 2-core box spin for ms each
    yield
    torch.set_num_threads(threads)
