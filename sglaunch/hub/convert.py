"""GGUF -> Hugging Face safetensors checkpoint (transformers + gguf, imported lazily).

The GGUF is read once (`read_gguf`): its metadata gives the `LlamaConfig` (the keys transformers'
GGUF loader maps), its tensors are dequantized with `gguf` and llama.cpp's q/k row permutation is
undone. They are assigned to a `LlamaForCausalLM` built on the meta device and saved as bf16
safetensors, plus tokenizer files any transformers (4.x or 5.x) and our server can read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, NamedTuple

Step = Callable[[str], None]  # called before each stage with its description

STEPS = ("reading the GGUF metadata", "dequantizing the weights", "writing bf16 safetensors",
         "writing the tokenizer")

def convert_gguf(gguf: Path, out: Path, chat_template_fallback: str, step: Step = lambda _: None) -> None:
    """Convert `gguf` into the HF checkpoint folder `out` (created)."""
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # NOTE: our rich bar shows the stages; tqdm would interleave
    step(STEPS[0])
    # NOTE: parsed once (gguf.GGUFReader, 7-8 s for SmolLM2 on 2 cores: a numpy view per vocabulary entry);
    # transformers' AutoConfig, GGUF weight loader and AutoTokenizer each parsed it again
    metadata, tensors = read_gguf(gguf)
    if metadata.get("general.architecture") != "llama":
        raise ValueError(f"{gguf.name} holds a {metadata.get('general.architecture')!r} model; "
                         "only Llama GGUFs are converted")
    config = llama_config(metadata, tensors)
    step(STEPS[1])
    # NOTE: a skeleton without storage: random init of the 135M parameters cost 3.6 s, all overwritten
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    weights = dequantized_weights(tensors, model.state_dict(), config)
    result = model.load_state_dict(weights, strict=False, assign=True)
    missing = [k for k in result.missing_keys if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or result.unexpected_keys:
        raise ValueError(f"GGUF tensors do not match the model: missing {missing[:3]}, "
                         f"unexpected {result.unexpected_keys[:3]}")
    model.tie_weights()  # lm_head still holds the meta tensor `assign` replaced in the embeddings
    step(STEPS[2])
    model.save_pretrained(str(out), safe_serialization=True)
    step(STEPS[3])
    # NOTE: the class our tokenizer_config.json names, 1.2 s; AutoTokenizer wrote the same files in 11.5 s
    # (it parses the whole GGUF once more for a config)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(str(out))
    portable_tokenizer_config(out, tokenizer.chat_template or chat_template_fallback, config.max_position_embeddings)
    readable_files(out)


class GgufTensor(NamedTuple):
    name: str
    ggml_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # torch order
    data: Any  # np.ndarray, a view of the mapped file: what gguf.dequantize takes


def read_gguf(path: Path) -> tuple[dict[str, Any], list[GgufTensor]]:
    """A GGUF file's metadata (`gguf.GGUFReader`'s fields, the reader's own GGUF.* entries left out)
    and tensors; the tensor data stays in the mapped file until used."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    metadata = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    tensors = [GgufTensor(t.name, t.tensor_type, tuple(int(d) for d in reversed(t.shape.tolist())), t.data)
               for t in reader.tensors]
    return metadata, tensors


def llama_config(metadata: dict[str, Any], tensors: list[GgufTensor]):
    """The `LlamaConfig` transformers' GGUF loader derives from this metadata."""
    from transformers import LlamaConfig
    from transformers.modeling_gguf_pytorch_utils import GGUF_CONFIG_MAPPING, GGUF_TOKENIZER_MAPPING

    # the keys transformers' GGUF loader maps: llama.* to the config, the special token ids beside them
    keys = {f"llama.{key}": field for key, field in GGUF_CONFIG_MAPPING["llama"].items()}
    keys.update((f"tokenizer.{key}", field) for key, field in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
                if field.endswith("_token_id"))
    fields = {field: metadata[key] for key, field in keys.items() if key in metadata}
    if "vocab_size" not in fields and "tokenizer.ggml.tokens" in metadata:  # llama.cpp rarely writes it
        fields["vocab_size"] = len(metadata["tokenizer.ggml.tokens"])
    # a file without a separate output matrix reuses the embeddings as the LM head
    fields["tie_word_embeddings"] = all(tensor.name != "output.weight" for tensor in tensors)
    return LlamaConfig(**fields)


def dequantized_weights(tensors: list[GgufTensor], hf_names, config) -> dict[str, Any]:
    """`{hf_name: bf16 tensor}` for the GGUF tensors named in `hf_names` (the model's state-dict keys)."""
    import torch
    from gguf import MODEL_ARCH, dequantize, get_tensor_name_map

    # NOTE: one name map for the model; transformers' loader built one per submodule (397 of them, 9 s)
    name_map = get_tensor_name_map(MODEL_ARCH.LLAMA, config.num_hidden_layers)
    to_hf = {gguf_name: key for key in hf_names
             if (gguf_name := name_map.get_name(key, try_suffixes=(".weight", ".bias"))) is not None}
    weights = {}
    for tensor in tensors:
        if tensor.name not in to_hf:  # as transformers: tensors without a parameter (rope_freqs) are left out
            continue
        values = dequantize(tensor.data, tensor.ggml_type)  # float32
        if ".attn_q." in tensor.name:
            values = unpermute(values, config.num_attention_heads)
        elif ".attn_k." in tensor.name:
            values = unpermute(values, config.num_key_value_heads)
        if not values.flags.writeable:  # an unquantized tensor comes back as a view of the read-only mapped file
            values = values.copy()
        weights[to_hf[tensor.name]] = torch.from_numpy(values).to(torch.bfloat16)
    return weights


def unpermute(weights, n_head: int):
    """Undo llama.cpp's q/k row permutation (`permute` in its convert_hf_to_gguf.py), as transformers does."""
    return weights.reshape(n_head, weights.shape[0] // n_head // 2, 2, *weights.shape[1:]).swapaxes(1, 2) \
        .reshape(weights.shape)


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
