"""Reading checkpoint folders: both rope spellings, EOS ids, and the clear refusals."""

from __future__ import annotations

import json
import shutil

import pytest

from sglaunch.engine.model_spec import check_tp_divides, find_weight_files, load_model_spec


def write_config(folder, **fields):
    folder.mkdir(parents=True, exist_ok=True)
    base = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 32,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    (folder / "config.json").write_text(json.dumps({**base, **fields}))
    return folder


def test_rope_theta_from_either_spelling(tmp_path):
    old = load_model_spec(str(write_config(tmp_path / "old", rope_theta=5e5)))
    new = load_model_spec(str(write_config(tmp_path / "new", rope_parameters={"rope_theta": 1e6, "rope_type": "default"})))
    assert old.rope_theta == 5e5 and new.rope_theta == 1e6


def test_llama3_rope_scaling_and_unsupported_rope(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    spec = load_model_spec(str(write_config(tmp_path / "l3", rope_theta=5e5, rope_scaling=scaling)))
    assert spec.rope_type == "llama3" and dict(spec.rope_scaling)["factor"] == 8.0
    with pytest.raises(ValueError, match="RoPE type 'yarn'"):
        load_model_spec(str(write_config(tmp_path / "yarn", rope_parameters={"rope_type": "yarn", "factor": 4.0})))


def test_eos_ids_from_generation_config_and_config(tmp_path):
    folder = write_config(tmp_path / "m", eos_token_id=2)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2]}))
    assert load_model_spec(str(folder)).eos_token_ids == (7, 2)


def test_family_flags(checkpoints):
    qwen2, qwen3, llama = (load_model_spec(str(checkpoints[n])) for n in ("qwen2", "qwen3", "llama"))
    assert qwen2.qkv_bias and not qwen2.o_bias and not qwen2.qk_norm and qwen2.tie_word_embeddings
    assert qwen3.qk_norm and qwen3.head_dim == 32
    assert not llama.tie_word_embeddings and llama.rope_theta == 50000.0
    assert len(find_weight_files(str(checkpoints["llama"]))) > 1  # sharded with an index


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "unsupported architecture"),
        ({"quantization_config": {"quant_method": "awq"}}, "quantized checkpoint.*awq"),
        ({"use_sliding_window": True}, "sliding-window"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_refusals(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        load_model_spec(str(write_config(tmp_path / "m", **fields)))


def test_missing_files(tmp_path, checkpoints):
    with pytest.raises(ValueError, match="not a folder"):
        load_model_spec(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        load_model_spec(str(tmp_path / "empty"))
    folder = write_config(tmp_path / "noweights")
    (folder / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="no \\*.safetensors.*pytorch_model.bin"):
        find_weight_files(str(folder))
    broken = tmp_path / "broken"
    shutil.copytree(checkpoints["llama"], broken)
    next(broken.glob("model-*.safetensors")).unlink()
    with pytest.raises(ValueError, match="missing file"):
        find_weight_files(str(broken))


def test_tp_must_divide_head_counts(tmp_path):
    spec = load_model_spec(str(write_config(tmp_path / "m")))
    check_tp_divides(spec, 2)
    with pytest.raises(ValueError, match="does not divide the model's 2 KV heads"):
        check_tp_divides(spec, 4)
    with pytest.raises(ValueError, match="4 attention heads"):
        check_tp_divides(spec, 3)
