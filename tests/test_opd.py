"""On-policy distillation without a server: the reverse-KL term, its gradient, the trainer's use of
it, the teacher's log-probs through the store, and the one-line refusals before anything starts.
(The run that learns is tests/test_on_policy_distillation.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from vime.config.args import parse_args
from vime.errors import ConfigError
from vime.config.preflight import check_opd
from vime.rollout.on_policy_distillation import response_log_probs, teacher_request, teacher_url
from vime.store import SampleStore
from vime.train.losses import LossConfig, compute_loss
from vime.train.opd import OpdConfig, apply_opd, reverse_kl, teacher_log_probs
from vime.types import Sample, SampleError


def test_the_penalty_is_the_sampled_reverse_kl_on_masked_tokens_only():
    student = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    teacher = torch.tensor([-1.5, -1.0, -0.5, -9.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert torch.equal(reverse_kl(student, teacher, mask), torch.tensor([0.5, -1.0, 0.0, 0.0]))

    result = apply_opd([torch.full((4,), 0.25)], [student], [teacher], [mask], coef=2.0)
    assert torch.equal(result.advantages[0], torch.tensor([0.25 - 1.0, 0.25 + 2.0, 0.25, 0.25]))
    assert result.metrics["opd_reverse_kl"] == pytest.approx((0.5 - 1.0 + 0.0) / 3)
    assert result.metrics["opd_teacher_logprob"] == pytest.approx((-1.5 - 1.0 - 0.5) / 3)


def test_misaligned_log_probs_are_refused_not_broadcast():
    with pytest.raises(ConfigError, match="must align"):
        reverse_kl(torch.zeros(3), torch.zeros(4), torch.ones(3))
    with pytest.raises(ConfigError, match="one each per sample"):
        apply_opd([torch.zeros(2)], [], [], [], coef=1.0)
    with pytest.raises(ConfigError, match="--opd-kl-coef must be >= 0"):
        OpdConfig(use_opd=True, opd_kl_coef=-1.0)


def test_the_policy_gradient_of_the_shaped_advantage_is_the_exact_reverse_kl_gradient():
    """On-policy, E_{y~pi}[-A(y) grad log pi(y)] with A = -(log pi - log pi_teacher) equals
    grad KL(pi || pi_teacher): summed over every token y weighted by pi(y) (an exact expectation,
    no sampling), the PPO loss with ratio 1 gives the analytic gradient of the reverse KL."""
    torch.manual_seed(0)
    logits = torch.randn(6, dtype=torch.float64, requires_grad=True)
    teacher = torch.log_softmax(torch.randn(6, dtype=torch.float64), -1)
    logp = torch.log_softmax(logits, -1)
    probs = logp.exp().detach()
    shaped = apply_opd([torch.zeros(6)], [logp.detach()], [teacher], [torch.ones(6)], coef=1.0).advantages[0]
    loss, _ = compute_loss(LossConfig(), log_probs=logp, loss_mask=torch.ones(6), weight=probs,
                           advantages=shaped.double())
    (grad_pg,) = torch.autograd.grad(loss, logits)
    fresh = torch.log_softmax(logits, -1)
    kl = (fresh.exp() * (fresh - teacher)).sum()
    (grad_kl,) = torch.autograd.grad(kl, logits)
    assert torch.allclose(grad_pg, grad_kl, atol=1e-6)


def test_a_sample_without_teacher_log_probs_names_the_reward_function_that_stores_them():
    samples = [Sample(index=3, rollout_id="3", tokens=[1, 2, 3], response_length=2)]
    with pytest.raises(ConfigError, match="sample 3 .* no teacher_log_probs.*on_policy_distillation.reward_func"):
        teacher_log_probs(samples)
    samples[0].teacher_log_probs = [-1.0, -2.0]
    assert torch.equal(teacher_log_probs(samples)[0], torch.tensor([-1.0, -2.0]))


def test_failed_samples_never_reached_the_teacher_and_get_no_penalty():
    """A FAILED or infra-failed rollout is not scored (vime.rollout.group), so it has no teacher
    log-probs; it keeps its advantages (its failure reward's, or 0) and stays out of the KL figure."""
    failed = Sample(index=1, tokens=[1, 2, 3], response_length=2, status=Sample.Status.FAILED)
    lost = Sample(index=2, tokens=[1, 2, 3], response_length=2, metadata={"infra_failure": "engine down"})
    scored = Sample(index=3, tokens=[1, 2, 3], response_length=2, teacher_log_probs=[-1.0, -1.0])
    teacher = teacher_log_probs([failed, lost, scored])
    assert teacher[:2] == [None, None]
    result = apply_opd([torch.full((2,), 0.5)] * 3, [torch.full((2,), -0.5)] * 3, teacher, [torch.ones(2)] * 3, 1.0)
    assert [a.tolist() for a in result.advantages] == [[0.5, 0.5], [0.5, 0.5], [0.0, 0.0]]
    assert result.metrics["opd_reverse_kl"] == 0.5 and result.metrics["opd_tokens"] == 2


def test_teacher_log_probs_stay_aligned_with_the_response_and_round_trip_through_the_store(tmp_path):
    with pytest.raises(SampleError, match="teacher_log_probs has 1 entries but response_length=2"):
        Sample(tokens=[1, 2, 3], response_length=2, teacher_log_probs=[-1.0]).validate()
    sample = Sample(index=0, rollout_id="r", tokens=[5, 6, 7, 8], response_length=3, reward=0.0,
                    rollout_log_probs=[-0.5, -1.25, -2.0], teacher_log_probs=[-0.75, -3.5, -0.125],
                    status=Sample.Status.COMPLETED)
    assert Sample.from_dict(json.loads(json.dumps(sample.to_dict()))) == sample
    with SampleStore.open(tmp_path / "run") as store:
        store.ensure_run("run")
        store.write_rollout("run", "r", [sample])
        assert store.read_rollout("run", "r") == [sample]


def test_the_teacher_is_asked_for_prompt_logprobs_and_its_answer_becomes_the_response_log_probs():
    sample = Sample(tokens=[11, 12, 13, 14], response_length=2)
    request = teacher_request(sample)
    assert request["token_ids"] == [11, 12, 13, 14] and request["sampling_params"]["prompt_logprobs"] == 0
    body = {"prompt_logprobs": [None, {"12": {"logprob": -1.0}}, {"13": {"logprob": -2.5}},
                                {"14": {"logprob": -0.25}, "99": {"logprob": -0.1}}]}
    assert response_log_probs(body, sample) == [-2.5, -0.25]


def test_the_teacher_is_the_topology_model_named_teacher_else_the_rm_url():
    args = parse_args(["--vllm-model-urls", "teacher=http://10.0.0.2:8000/", "--rm-url", "http://x:1/generate"])
    assert teacher_url(args) == "http://10.0.0.2:8000"
    assert teacher_url(parse_args(["--rm-url", "http://x:1/generate"])) == "http://x:1"
    assert teacher_url(parse_args([])) is None


OPD = ["--use-opd", "--custom-rm-path", "vime.rollout.on_policy_distillation.reward_func"]


def test_opd_type_names_the_teacher_server_and_a_teacher_inside_the_trainer_is_refused():
    for name in ("vllm", "sglang"):  # slime's sglang: the same thing, a server scoring each rollout
        assert OpdConfig.from_args(parse_args([*OPD, "--opd-type", name])).opd_type == name
    with pytest.raises(ConfigError, match="--opd-type megatron: vime has no teacher inside the trainer; .* "
                                          "pass --opd-type vllm"):
        parse_args([*OPD, "--opd-type", "megatron"])
    with pytest.raises(ConfigError, match="--opd-type vllm has no effect without --use-opd: add --use-opd"):
        parse_args(["--opd-type", "vllm"])


def _serving(tmp_path: Path, student: Path, teacher: Path, update: bool = False) -> str:
    path = tmp_path / "serving.yaml"
    path.write_text(f"""
vllm:
  - name: actor
    server_groups: [{{worker_type: regular, num_gpus: 1}}]
  - name: teacher
    model_path: {teacher}
    update_weights: {str(update).lower()}
    server_groups: [{{worker_type: regular, num_gpus: 1}}]
""")
    return str(path)


def _model(tmp_path: Path, name: str, vocab: dict[str, int] | None = None, vocab_size: int = 4) -> Path:
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"vocab_size": vocab_size}))
    vocab = vocab or {"a": 0, "b": 1, "c": 2}
    (path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}, "added_tokens": [
        {"id": 3, "content": "<|im_end|>"}]}))
    return path


def test_opd_without_a_teacher_or_without_its_reward_function_is_one_line_before_start(tmp_path):
    student = _model(tmp_path, "student")
    with pytest.raises(ConfigError, match="--use-opd: the teacher's log-probs are fetched by the reward function"):
        check_opd(parse_args(["--hf-checkpoint", str(student), "--use-opd"]))
    with pytest.raises(ConfigError, match="--use-opd: no teacher .* named 'teacher' .* --vllm-model-urls teacher="):
        check_opd(parse_args(["--hf-checkpoint", str(student), *OPD]))
    check_opd(parse_args(["--hf-checkpoint", str(student), *OPD, "--vllm-model-urls", "teacher=http://h:1"]))


def test_a_teacher_with_another_vocabulary_or_one_that_takes_weights_is_refused(tmp_path):
    student = _model(tmp_path, "student")
    same = tmp_path / "same"
    shutil.copytree(student, same)
    check_opd(parse_args(["--hf-checkpoint", str(student), *OPD,
                          "--vllm-config", _serving(tmp_path, student, same)]))
    other = _model(tmp_path, "other", vocab={"a": 0, "c": 1, "b": 2})
    with pytest.raises(ConfigError, match=r"different vocabularies \(id 1 is 'c' in the teacher, 'b' in the student\)"):
        check_opd(parse_args(["--hf-checkpoint", str(student), *OPD,
                              "--vllm-config", _serving(tmp_path, student, other)]))
    bigger = _model(tmp_path, "bigger", vocab_size=8)
    with pytest.raises(ConfigError, match=r"different vocabularies \(vocab_size 8 vs 4\)"):
        check_opd(parse_args(["--hf-checkpoint", str(student), *OPD,
                              "--vllm-config", _serving(tmp_path, student, bigger)]))
    with pytest.raises(ConfigError, match="update_weights"):  # a teacher that would be trained
        check_opd(parse_args(["--hf-checkpoint", str(student), *OPD,
                              "--vllm-config", _serving(tmp_path, student, student, update=True)]))
