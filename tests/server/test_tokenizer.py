"""Tokenizer loading, chat templates, incremental detokenization and stop strings (no engine)."""

from __future__ import annotations

import json

import pytest

from sglaunch.errors import SglaunchError
from sglaunch.server.tokenizer import (
    REPLACEMENT_CHAR, IncrementalDetokenizer, StopStringMatcher, load_tokenizer,
)

from .checkpoints import CHATML_TEMPLATE, build_tokenizer

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
CHATML_PROMPT = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
                 "<|im_start|>assistant\n")
# characters the BPE never saw: each splits into several byte-level tokens
MULTIBYTE_TEXT = "Llama 🦙 says 你好, then Ωmega ✓ and ü."


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    build_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def tokenizer(tok_dir):
    return load_tokenizer(tok_dir)


# ---------------------------------------------------------------- loading and chat templates


def test_encode_decode_round_trip(tokenizer):
    ids = tokenizer.encode(MULTIBYTE_TEXT)
    assert tokenizer.decode(ids) == MULTIBYTE_TEXT
    assert tokenizer.eos_token_id == tokenizer.backend.token_to_id("<|im_end|>")


def test_special_tokens_are_skipped_on_decode(tokenizer):
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert tokenizer.eos_token_id in ids
    assert tokenizer.decode(ids) == "user\nhi"
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"


def test_chat_template_from_tokenizer_config(tokenizer):
    assert tokenizer.render_chat(MESSAGES) == CHATML_PROMPT
    assert tokenizer.render_chat(MESSAGES, add_generation_prompt=False) == CHATML_PROMPT[:-len(
        "<|im_start|>assistant\n")]
    assert tokenizer.decode(tokenizer.encode_chat(MESSAGES), skip_special_tokens=False) == CHATML_PROMPT


def test_transformers5_tokenizers_backend_with_jinja_file(tmp_path):
    """transformers 5 writes tokenizer_class TokenizersBackend and chat_template.jinja."""
    build_tokenizer(tmp_path, tokenizer_class="TokenizersBackend", chat_template=None)
    (tmp_path / "chat_template.jinja").write_text(CHATML_TEMPLATE)
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.render_chat(MESSAGES) == CHATML_PROMPT


def test_chat_template_override_file_and_builtin(tok_dir, tmp_path):
    custom = tmp_path / "custom.jinja"
    custom.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    assert load_tokenizer(tok_dir, str(custom)).render_chat(MESSAGES) == "[system] Be brief.\n[user] Hi!\n"
    as_json = tmp_path / "template.json"
    as_json.write_text(json.dumps({"chat_template": CHATML_TEMPLATE}))
    assert load_tokenizer(tok_dir, str(as_json)).render_chat(MESSAGES) == CHATML_PROMPT
    assert load_tokenizer(tok_dir, "chatml").render_chat(MESSAGES) == CHATML_PROMPT


def test_named_template_list_picks_default(tmp_path):
    build_tokenizer(tmp_path, chat_template=None)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "TOOLS"},
                               {"name": "default", "template": CHATML_TEMPLATE}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_tokenizer(tmp_path).render_chat(MESSAGES) == CHATML_PROMPT


def test_missing_template_and_bad_paths(tmp_path):
    build_tokenizer(tmp_path, chat_template=None)
    with pytest.raises(ValueError, match="no chat template"):
        load_tokenizer(tmp_path).render_chat(MESSAGES)
    with pytest.raises(SglaunchError, match="Chat template not found"):
        load_tokenizer(tmp_path, "no-such-template.jinja")
    with pytest.raises(SglaunchError, match="not found"):
        load_tokenizer(tmp_path / "missing")


def test_broken_template_fails_at_load(tok_dir, tmp_path):
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m['content'] }")
    with pytest.raises(SglaunchError, match="does not compile"):
        load_tokenizer(tok_dir, str(broken))


def test_template_raise_exception_is_a_value_error(tok_dir, tmp_path):
    strict = tmp_path / "strict.jinja"
    strict.write_text("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}"
                      "{% endif %}{{ messages[0]['content'] }}")
    with pytest.raises(ValueError, match="user first"):
        load_tokenizer(tok_dir, str(strict)).render_chat(MESSAGES)


def test_add_bos_token_is_honoured(tmp_path):
    build_tokenizer(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config.update(bos_token="<|endoftext|>", add_bos_token=True)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.encode("hi")[0] == tokenizer.bos_token_id
    assert tokenizer.encode("hi", add_special_tokens=False)[0] != tokenizer.bos_token_id


# ---------------------------------------------------------------- incremental detokenization


def _stream(tokenizer, prompt_ids, output_ids, step=1):
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
    deltas = [detokenizer.add(output_ids[i:i + step]) for i in range(0, len(output_ids), step)]
    deltas.append(detokenizer.flush())
    return deltas


@pytest.mark.parametrize("step", [1, 2, 3])
def test_detokenizer_streams_whole_characters(tokenizer, step):
    ids = tokenizer.encode(MULTIBYTE_TEXT)
    deltas = _stream(tokenizer, [], ids, step)
    assert "".join(deltas) == MULTIBYTE_TEXT
    assert not any(REPLACEMENT_CHAR in delta for delta in deltas)
    assert len([d for d in deltas if d]) > 3  # it really streams


def test_detokenizer_matches_full_decode_after_any_prompt_split(tokenizer):
    ids = tokenizer.encode(MULTIBYTE_TEXT)
    for split in range(1, len(ids)):
        expected = tokenizer.decode(ids)[len(tokenizer.decode(ids[:split])):]
        assert "".join(_stream(tokenizer, ids[:split], ids[split:])) == expected


def test_detokenizer_flushes_an_incomplete_character(tokenizer):
    first_byte_of_llama = tokenizer.encode("🦙")[:1]
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert detokenizer.add(first_byte_of_llama) == ""
    assert detokenizer.flush() == REPLACEMENT_CHAR


def test_detokenizer_keeps_leading_spaces_with_metaspace(tmp_path):
    """SentencePiece-style tokenizers drop the first token's space unless decoded in context."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    sp = Tokenizer(models.BPE(unk_token="<unk>"))
    sp.pre_tokenizer = pre_tokenizers.Metaspace()
    sp.decoder = decoders.Metaspace()
    sp.train_from_iterator(["hello world again and again"] * 10,
                           trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>"], show_progress=False))
    sp.save(str(tmp_path / "tokenizer.json"))
    tokenizer = load_tokenizer(tmp_path)
    ids = tokenizer.encode("hello world again")
    hello = len(tokenizer.encode("hello"))
    assert "".join(_stream(tokenizer, ids[:hello], ids[hello:])) == " world again"


# ---------------------------------------------------------------- stop strings


@pytest.mark.parametrize(
    ("stops", "pieces", "emitted", "matched"),
    [
        (["END"], ["abc", "deEN", "Dxyz"], ["abc", "de", ""], "END"),  # split across deltas
        (["END"], ["aEN", "ough"], ["a", "ENough"], None),  # a false start is released
        (["\n\n", "##"], ["one\n", "two##\n\nx"], ["one", "\ntwo"], "##"),  # earliest stop wins
        (["stop"], ["stop right away"], [""], "stop"),
        (["aab"], ["aaa", "ab"], ["a", "a"], "aab"),  # overlapping prefixes
        ([], ["any", "thing"], ["any", "thing"], None),
    ],
)
def test_stop_string_matcher(stops, pieces, emitted, matched):
    matcher = StopStringMatcher(stops)
    out = []
    for piece in pieces:
        out.append(matcher.feed(piece))
        if matcher.matched:
            break
    assert out == emitted
    assert matcher.matched == matched


def test_stop_matcher_flush_releases_held_text():
    matcher = StopStringMatcher(["</answer>"])
    assert matcher.feed("42 </ans") == "42 "
    assert matcher.flush() == "</ans"
    assert matcher.matched is None


def test_stop_matcher_ignores_text_after_a_match():
    matcher = StopStringMatcher(["x"])
    assert matcher.feed("abxcd") == "ab"
    assert matcher.feed("more") == ""
    assert matcher.flush() == ""



def _plain(tokenizer, prompt_ids, skip_special_tokens=True):
    """The detokenizer without the library's DecodeStream (the reference path)."""
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens)
    detokenizer._step = None
    return detokenizer


@pytest.mark.parametrize("skip_special", [True, False])
def test_decode_stream_path_streams_exactly_like_the_plain_path(tokenizer, skip_special):
    import random

    rng = random.Random(7)
    text_ids = tokenizer.encode(MULTIBYTE_TEXT + " " + CHATML_PROMPT)
    vocab = tokenizer.vocab_size
    for trial in range(150):
        ids = text_ids if trial % 3 == 0 else [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
        split = rng.randint(0, len(ids) - 1)
        prompt, output = ids[:split], ids[split:]
        fast, plain = IncrementalDetokenizer(tokenizer, prompt, skip_special), _plain(tokenizer, prompt, skip_special)
        i = 0
        while i < len(output):
            n = rng.choice([0, 1, 1, 1, 2, 3])
            chunk = output[i:i + n]
            assert fast.add(chunk) == plain.add(chunk), (trial, prompt, output, i)
            i += n
        assert fast.flush() == plain.flush()
    assert IncrementalDetokenizer(tokenizer, text_ids[:3])._step is not None  # the fast path ran
