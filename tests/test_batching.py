"""Rollout-aware batching: whole rollouts per step, one mean per rollout, packed rows that
attend like separate sequences."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vime.errors import ConfigError
from vime.train.batching import (
    TrainSample,
    equalize_micro_batch_counts,
    group_rollouts,
    loss_weights,
    micro_batches,
    num_tokens,
    pack,
    plan_micro_batches,
    prepare_step,
    shard_for_ranks,
    split_into_steps,
)
from vime.train.losses import token_logprobs
from vime.types import Sample


def make(rollout_id=None, prompt=2, mask=(1,), lps=None, group=0, start=1) -> Sample:
    n = prompt + len(mask)
    return Sample(group_index=group, rollout_id=rollout_id, tokens=list(range(start, start + n)),
                  response_length=len(mask), loss_mask=list(mask), rollout_log_probs=lps)


# ---- steps -----------------------------------------------------------------------------------


def test_samples_are_grouped_into_rollouts_by_rollout_id_in_first_appearance_order():
    a1, b, a2, c, d = make("a"), make("b"), make("a"), make(None), make(None)
    assert group_rollouts([a1, b, a2, c, d]) == [[a1, a2], [b], [c], [d]]


def test_steps_hold_exactly_global_batch_size_rollouts_and_keep_siblings_together():
    samples = [make("a"), make("a"), make("b"), make("c"), make("c"), make("c"), make("d"), make("e")]
    steps, remainder = split_into_steps(samples, 2)
    assert [[r[0].rollout_id for r in step] for step in steps] == [["a", "b"], ["c", "d"]]
    assert [len(r) for r in steps[1]] == [3, 1]
    assert [r[0].rollout_id for r in remainder] == ["e"]


def test_steps_accept_rollout_lists_and_reject_a_zero_batch_size():
    rollouts = [[make("a")], [make("b"), make("b")]]
    steps, remainder = split_into_steps(rollouts, 3)
    assert steps == [] and remainder == rollouts
    with pytest.raises(ConfigError, match="--global-batch-size must be >= 1, got 0"):
        split_into_steps(rollouts, 0)


# ---- loss weights ----------------------------------------------------------------------------


def test_each_rollout_gets_one_token_mean_and_empty_rollouts_are_not_counted():
    # rollout A: 3 masked tokens over two siblings; B: 1 token; C: none (not counted) -> R = 2
    weights = loss_weights([[torch.tensor([1, 1, 0]), torch.tensor([1])], [torch.tensor([1])], [torch.tensor([0, 0])]])
    assert weights[0][0].tolist() == pytest.approx([1 / 6, 1 / 6, 0.0])
    assert weights[0][1].tolist() == pytest.approx([1 / 6])
    assert weights[1][0].tolist() == pytest.approx([1 / 2])
    assert weights[2][0].tolist() == [0.0, 0.0]


def test_prepare_step_attaches_advantages_and_weights_in_sample_order():
    step = [[make("a", mask=(1, 1)), make("a", mask=(0, 1))], [make("b", mask=(1,))]]
    items = prepare_step(step, [torch.full((2,), 1.0), torch.full((2,), 2.0), torch.full((1,), 3.0)])
    assert [t.sample for t in items] == [s for r in step for s in r]
    assert [t.weights.tolist() for t in items] == [pytest.approx([1 / 6, 1 / 6]), pytest.approx([0, 1 / 6]), [0.5]]
    with pytest.raises(ConfigError, match="has 2 response tokens but 1 advantages"):
        prepare_step(step, [torch.ones(1), torch.ones(2), torch.ones(1)])


def test_infra_failed_rollouts_get_no_weight_and_do_not_dilute_the_others():
    failed = make("f", mask=(1, 1))
    failed.metadata["infra_failure"] = "sandbox died"
    items = prepare_step([[make("a", mask=(1, 1))], [failed]], [torch.zeros(2), torch.zeros(2)])
    assert [t.weights.tolist() for t in items] == [[0.5, 0.5], [0.0, 0.0]]


# ---- micro-batches and ranks -----------------------------------------------------------------


def lengths(mbs) -> list[list[int]]:
    return [[num_tokens(s) for s in mb] for mb in mbs]


def test_micro_batches_are_first_fit_decreasing_under_the_token_budget():
    samples = [make(prompt=1, mask=(1,) * (n - 1)) for n in (3, 7, 2, 5, 4)]
    assert lengths(micro_batches(samples, 8)) == [[7], [5, 3], [4, 2]]


def test_a_sample_longer_than_the_budget_gets_a_micro_batch_of_its_own():
    samples = [make(prompt=1, mask=(1,) * 11), make(prompt=1, mask=(1,))]
    assert lengths(micro_batches(samples, 5)) == [[12], [2]]


def test_ranks_get_balanced_whole_samples_and_one_each_when_possible():
    samples = [make(prompt=1, mask=(1,) * (n - 1)) for n in (9, 8, 2, 2, 2, 2, 2)]
    shards = shard_for_ranks(samples, 3)
    assert sorted(sum(num_tokens(s) for s in shard) for shard in shards) == [8, 9, 10]
    assert sorted(id(s) for shard in shards for s in shard) == sorted(id(s) for s in samples)
    assert all(shard_for_ranks(samples[:3], 3))


def test_every_rank_runs_the_same_number_of_micro_batches():
    a, b, c = (make(prompt=1, mask=(1,)) for _ in range(3))
    per_rank = equalize_micro_batch_counts([[[a], [b]], [[c]], []])
    assert [len(mbs) for mbs in per_rank] == [2, 2, 2]
    assert per_rank[1] == [[c], []] and per_rank[2] == [[], []]
    plan = plan_micro_batches([make(prompt=1, mask=(1,) * 3) for _ in range(5)], 2, 8)
    assert lengths(plan[0]) == [[4, 4], [4]]
    assert lengths(plan[1]) == [[4], [4]]  # its one full micro-batch was split to match rank 0


# ---- packing ---------------------------------------------------------------------------------


def test_pack_concatenates_samples_and_indexes_response_positions():
    s1 = make("a", prompt=2, mask=(1, 0), lps=[-0.1, 0.0], start=10)  # tokens 10 11 | 12 13
    s2 = make("b", prompt=1, mask=(1,), lps=[-0.2], start=20)  # tokens 20 | 21
    items = [TrainSample(s1, torch.tensor([1.0, 1.0]), torch.tensor([0.25, 0.0])),
             TrainSample(s2, torch.tensor([-1.0]), torch.tensor([0.5]))]
    p = pack(items)
    assert p.input_ids.tolist() == [[10, 11, 12, 13, 20, 21]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 0, 1]]
    assert p.cu_seqlens.tolist() == [0, 4, 6]
    assert p.logit_index.tolist() == [1, 2, 4] and p.targets.tolist() == [12, 13, 21]
    assert p.sample_index.tolist() == [0, 0, 1] and p.loss_mask.tolist() == [1.0, 0.0, 1.0]
    assert p.rollout_log_probs.tolist() == pytest.approx([-0.1, 0.0, -0.2])
    assert p.advantages.tolist() == [1.0, 1.0, -1.0] and p.weights.tolist() == [0.25, 0.0, 0.5]
    assert [t.tolist() for t in p.split(torch.arange(3))] == [[0, 1], [2]]
    assert p.model_inputs()["use_cache"] is False


def test_pack_refuses_a_sample_without_prompt():
    with pytest.raises(ConfigError, match="empty prompt"):
        pack([make(prompt=0, mask=(1, 1))])


# ---- packed rows in transformers -------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)
    return {impl: Qwen2ForCausalLM._from_config(config, attn_implementation=impl).eval() for impl in ("sdpa", "eager")}


def random_samples(lengths_and_prompts, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n, prompt in lengths_and_prompts:
        tokens = torch.randint(0, 256, (n,), generator=g).tolist()
        out.append(Sample(tokens=tokens, response_length=n - prompt, loss_mask=[1] * (n - prompt)))
    return out


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_packed_row_gives_the_logits_of_separate_sequences(tiny_qwen2, impl):
    """transformers 5.x derives a block-diagonal causal mask from restarting position_ids when
    attention_mask is None and no cache is used."""
    model = tiny_qwen2[impl]
    samples = random_samples([(6, 2), (11, 4), (3, 1)])
    p = pack(samples)
    with torch.no_grad():
        packed = model(**p.model_inputs()).logits[0]
        separate = torch.cat([model(input_ids=torch.tensor([s.tokens])).logits[0] for s in samples])
        assert torch.allclose(packed, separate, atol=1e-5)
        logp = token_logprobs(packed[p.logit_index], p.targets)
        expected = torch.cat([
            token_logprobs(model(input_ids=torch.tensor([s.tokens])).logits[0, s.prompt_length - 1 : -1],
                           torch.tensor(s.response_tokens))
            for s in samples
        ])
    assert torch.allclose(logp, expected, atol=1e-5)


def test_packed_row_leaks_across_samples_when_the_kv_cache_is_on(tiny_qwen2):
    """Why `model_inputs()` sets use_cache=False: with the config default (use_cache=True), even in
    train mode, transformers 5.19 skips packed-sequence detection and every sample attends to the
    ones before it. If this starts failing, transformers changed; recheck the packing contract."""
    model = tiny_qwen2["sdpa"]
    samples = random_samples([(6, 2), (5, 1)], seed=1)
    p = pack(samples)
    with torch.no_grad():
        leaky = model(input_ids=p.input_ids, position_ids=p.position_ids).logits[0]
        second = model(input_ids=torch.tensor([samples[1].tokens])).logits[0]
    assert not torch.allclose(leaky[6:], second, atol=1e-3)


# ---- the property: micro-batched weighted sums are the mean over rollouts --------------------


rollout_strategy = st.lists(  # one rollout = 1-4 siblings, each a list of (mask bit, token loss)
    st.lists(
        st.one_of(
            st.lists(st.tuples(st.integers(0, 1), st.floats(-1, 1)), min_size=1, max_size=50),
            st.integers(1, 50).map(lambda n: [(0, 0.5)] * n),  # all-zero mask
        ),
        min_size=1, max_size=4,
    ),
    min_size=1, max_size=16,
)


@settings(max_examples=80, deadline=None)
@given(rollouts=rollout_strategy, budget=st.integers(1, 200), gbs=st.integers(1, 6), world_size=st.integers(1, 4),
       prompt=st.integers(1, 5))
def test_micro_batched_weighted_loss_is_the_mean_over_rollouts(rollouts, budget, gbs, world_size, prompt):
    samples = []
    for k, siblings in enumerate(rollouts):
        for tokens in siblings:
            mask = [m for m, _ in tokens]
            # the per-token loss rides in rollout_log_probs, so packing must keep it aligned
            samples.append(make(f"r{k}", prompt=prompt, mask=mask, lps=[x for _, x in tokens]))
    steps, remainder = split_into_steps(samples, gbs)
    assert len(remainder) < gbs and sum(map(len, steps)) + len(remainder) == len(rollouts)
    step_of = {}
    for k, step in enumerate(steps):
        assert len(step) == gbs
        for s in (s for r in step for s in r):
            assert step_of.setdefault(s.rollout_id, k) == k  # no rollout straddles two steps
    for step in steps:

        means = []
        for r in step:
            pairs = [(m, x) for s in r for m, x in zip(s.loss_mask, s.rollout_log_probs)]
            n = sum(m for m, _ in pairs)
            if n:
                means.append(sum(x for m, x in pairs if m) / n)
        expected = sum(means) / len(means) if means else 0.0

        items = prepare_step(step, [torch.zeros(s.response_length) for r in step for s in r])
        total = torch.zeros((), dtype=torch.float64)
        for rank in plan_micro_batches(items, world_size, budget):
            for mb in rank:
                if not mb:
                    continue
                assert sum(num_tokens(t) for t in mb) <= budget or len(mb) == 1
                p = pack(mb)
                total += (p.weights * p.rollout_log_probs * p.loss_mask).double().sum()
        assert total.item() == pytest.approx(expected, abs=1e-5)
