"""The policy's tokenizer: the class `AutoTokenizer` picked for a checkpoint is remembered, so a
later process loads that class without importing `AutoTokenizer` (and torch): a rollout worker
starts ~8 s of CPU sooner at every launch, with the same tokenizer."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from vime.errors import ConfigError
from vime.rollout.tokenization import CLASSES_FILE, get_tokenizer, known_tokenizer_class

TEXTS = ["count to 3", "  leading spaces, ümlauts and 数字 123\n\ttabs", "<|im_start|>user\nhi<|im_end|>"]
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "count to 4"},
        {"role": "assistant", "content": "1 2 3 4"}, {"role": "user", "content": "again"}]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh record of tokenizer classes, and no tokenizer loaded in this process yet."""
    monkeypatch.setenv("VIME_CACHE", str(tmp_path / "cache"))
    get_tokenizer.cache_clear()
    yield tmp_path / "cache" / CLASSES_FILE
    get_tokenizer.cache_clear()


def load_in_a_new_process(model) -> list[str]:
    """Load the tokenizer in a fresh interpreter; the heavy modules that it imported."""
    probe = ("import sys; from vime.rollout.tokenization import get_tokenizer; get_tokenizer(sys.argv[1]); "
             "print(' '.join(m for m in ('torch', 'transformers.models.auto.tokenization_auto') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe, str(model)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_second_load_is_the_class_autotokenizer_picked_token_for_token_without_importing_it(
        tiny_model_dir, cache):
    from transformers import AutoTokenizer

    assert load_in_a_new_process(tiny_model_dir) == ["torch", "transformers.models.auto.tokenization_auto"]
    assert cache.exists(), "the first load records the class AutoTokenizer picked"
    assert load_in_a_new_process(tiny_model_dir) == [], "the second load imports neither torch nor AutoTokenizer"
    known = known_tokenizer_class(str(tiny_model_dir))
    auto = AutoTokenizer.from_pretrained(str(tiny_model_dir), trust_remote_code=True)
    assert known is type(auto)
    fast = get_tokenizer(str(tiny_model_dir))
    assert type(fast) is type(auto)
    assert fast.get_vocab() == auto.get_vocab()
    assert fast.all_special_tokens == auto.all_special_tokens and fast.eos_token_id == auto.eos_token_id
    for text in TEXTS:
        assert fast.encode(text, add_special_tokens=False) == auto.encode(text, add_special_tokens=False)
    render = dict(tokenize=False, add_generation_prompt=True)
    assert fast.apply_chat_template(CHAT, **render) == auto.apply_chat_template(CHAT, **render)


def test_a_changed_checkpoint_config_is_resolved_by_autotokenizer_again(tiny_model_dir, tmp_path, cache):
    copy = tmp_path / "model"
    shutil.copytree(tiny_model_dir, copy)
    get_tokenizer(str(copy))
    assert known_tokenizer_class(str(copy)) is not None
    config = json.loads((copy / "tokenizer_config.json").read_text())
    (copy / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 128}))
    assert known_tokenizer_class(str(copy)) is None


def test_a_record_naming_a_class_that_is_gone_is_ignored(tiny_model_dir, cache):
    get_tokenizer(str(tiny_model_dir))
    record = json.loads(cache.read_text())
    cache.write_text(json.dumps({key: "transformers:NoSuchTokenizer" for key in record}))
    assert known_tokenizer_class(str(tiny_model_dir)) is None
    cache.write_text("not json")
    assert known_tokenizer_class(str(tiny_model_dir)) is None


def test_a_directory_without_a_tokenizer_is_one_config_error(tmp_path, cache):
    with pytest.raises(ConfigError, match="cannot load a tokenizer"):
        get_tokenizer(str(tmp_path))
