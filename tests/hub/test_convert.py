"""convert.py's GGUF reading (one gguf.GGUFReader pass) and config against transformers' GGUF loader,
on small synthetic files (the real model's conversion: test_real_default_model.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
gguf = pytest.importorskip("gguf")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from sglaunch.hub import convert  # noqa: E402

TOKENS = ["<unk>", "<s>", "</s>", "a", "b", "ab"]


def write_llama_gguf(path: Path, *, with_output: bool = False) -> Path:
    """A tiny llama GGUF: every metadata type the SmolLM2 file uses, F32 and Q8_0 tensors."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny llama")
    writer.add_context_length(128)
    writer.add_embedding_length(64)
    writer.add_block_count(1)
    writer.add_feed_forward_length(96)
    writer.add_rope_dimension_count(8)  # not hidden / heads: the key must be read
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(100000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3, 3, 3, 1, 1, 1])
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(4)  # none of LlamaConfig's defaults
    writer.add_eos_token_id(5)
    writer.add_pad_token_id(5)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_array("test.floats", [0.5, 1.5])
    tensors = {"token_embd.weight": (len(TOKENS), 64), "blk.0.attn_q.weight": (64, 64),
               "blk.0.attn_k.weight": (32, 64), "blk.0.attn_norm.weight": (64,)}
    if with_output:
        tensors["output.weight"] = (len(TOKENS), 64)
    for name, shape in tensors.items():
        values = rng.standard_normal(shape, dtype=np.float32)
        if len(shape) == 1:
            writer.add_tensor(name, values)
        else:
            qtype = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_read_gguf_matches_the_gguf_package(tmp_path):
    path = write_llama_gguf(tmp_path / "tiny.gguf")
    metadata, tensors = convert.read_gguf(path)
    reader = gguf.GGUFReader(str(path))
    expected = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    assert metadata == expected  # f32 values too: both widen the stored float exactly
    assert [t.name for t in tensors] == [t.name for t in reader.tensors]
    for ours, theirs in zip(tensors, reader.tensors):
        assert ours.ggml_type == theirs.tensor_type and ours.shape == tuple(reversed(theirs.shape.tolist()))
        assert np.array_equal(gguf.dequantize(ours.data, ours.ggml_type),
                              gguf.dequantize(theirs.data, theirs.tensor_type)), ours.name


@pytest.mark.parametrize("with_output", [False, True], ids=["tied", "separate-lm-head"])
def test_llama_config_is_the_one_transformers_reads(tmp_path, with_output):
    from transformers import AutoConfig, LlamaConfig

    path = write_llama_gguf(tmp_path / "tiny.gguf", with_output=with_output)
    metadata, tensors = convert.read_gguf(path)
    ours = convert.llama_config(metadata, tensors).to_dict()
    # what convert_gguf did before it read the file itself
    raw = {k: v for k, v in AutoConfig.from_pretrained(str(tmp_path), gguf_file=path.name).to_dict().items()
           if k not in ("quantization_config", "_name_or_path", "_model_name_or_path", "architectures", "dtype",
                        "transformers_version")}
    assert ours == LlamaConfig(**raw).to_dict()
    assert ours["tie_word_embeddings"] is not with_output and ours["vocab_size"] == len(TOKENS)


def test_unpermute_undoes_llama_cpp_permute():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    weights = np.arange(32 * 8, dtype=np.float32).reshape(32, 8)
    for n_head in (2, 4):
        # llama.cpp's convert_hf_to_gguf.py `permute`
        permuted = weights.reshape(n_head, 2, 32 // n_head // 2, 8).swapaxes(1, 2).reshape(weights.shape)
        assert np.array_equal(convert.unpermute(permuted, n_head), weights)
        assert np.array_equal(convert.unpermute(permuted, n_head),
                              LlamaTensorProcessor()._reverse_permute_weights(permuted, n_head))
