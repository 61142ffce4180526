"""A drafter config made for another target (hidden 32, vocab 97)."""

from sglaunch.speculative.drafter_config import parse_drafter_config


def foreign_drafter_config():
    return parse_drafter_config(dict(
        architectures=["LlamaDSparkModel"], model_type="llama", vocab_size=97, hidden_size=32, intermediate_size=64,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_theta=10000.0, block_size=7, mask_token_id=96, target_layer_ids=[0],
        num_target_layers=4, markov_rank=4, markov_head_type="vanilla", enable_confidence_head=True,
        confidence_head_with_markov=True))
