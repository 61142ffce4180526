"""GGUF -> Hugging Face safetensors checkpoint (transformers + gguf, imported lazily).

transformers dequantizes the GGUF (and undoes llama.cpp's q/k row permutation); a model it
loads that way carries a `quantization_config` and refuses `save_pretrained`, so we rebuild a
plain `LlamaForCausalLM` from the config without it, copy the weights in and save bf16
safetensors, plus tokenizer files any transformers (4.x or 5.x) and our server can read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

Step = Callable[[str], None]  # called before each stage with its description

STEPS = ("reading the GGUF metadata", "dequantizing the weights", "writing bf16 safetensors",
         "writing the tokenizer")


def convert_gguf(gguf: Path, out: Path, chat_template_fallback: str, step: Step = lambda _: None) -> None:
    """Convert `gguf` into the HF checkpoint folder `out` (created)."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # NOTE: our rich bar shows the stages; tqdm would interleave
    step(STEPS[0])
    folder, name = str(gguf.parent), gguf.name
    raw = {k: v for k, v in AutoConfig.from_pretrained(folder, gguf_file=name).to_dict().items()
           if k not in ("quantization_config", "_name_or_path", "_model_name_or_path", "architectures", "dtype",
                        "transformers_version")}
    if raw.get("model_type") != "llama":
        raise ValueError(f"{name} holds a {raw.get('model_type')!r} model; only Llama GGUFs are converted")
    config = LlamaConfig(**raw)
    step(STEPS[1])
    model = LlamaForCausalLM(config)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict(tensors, strict=False)
    missing = [k for k in result.missing_keys if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or result.unexpected_keys:
        raise ValueError(f"GGUF tensors do not match the model: missing {missing[:3]}, "
                         f"unexpected {result.unexpected_keys[:3]}")
    step(STEPS[2])
    model.to(torch.bfloat16).save_pretrained(str(out), safe_serialization=True)
    step(STEPS[3])
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokenizer.save_pretrained(str(out))
    portable_tokenizer_config(out, tokenizer.chat_template or chat_template_fallback, config.max_position_embeddings)
    readable_files(out)


def portable_tokenizer_config(out: Path, chat_template: str, max_length: int) -> None:
    """tokenizer_config.json that transformers 4.x and 5.x and our server all load:
    `PreTrainedTokenizerFast` (5.x writes `TokenizersBackend`), the chat template inline."""
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text()) if path.is_file() else {}
    cfg.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=chat_template, add_bos_token=False,
               add_eos_token=False)
    cfg["model_max_length"] = max_length
    for key in ("auto_map", "backend", "is_local", "local_files_only"):  # transformers 5.x runtime fields
        cfg.pop(key, None)
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    (out / "chat_template.jinja").unlink(missing_ok=True)


def readable_files(out: Path) -> None:
    """safetensors writes 0600 files; a shared cache wants the umask's usual modes."""
    import os

    umask = os.umask(0)
    os.umask(umask)
    for path in out.iterdir():
        path.chmod(0o666 & ~umask)
