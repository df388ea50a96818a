"""Loss math of the hindsight terms against hand-computed numbers, and where the gradient goes."""

from __future__ import annotations

import math

import pytest
import torch

from hindsearch.hindsight import losses as L


def distill(name: str, mask: torch.Tensor, lS: torch.Tensor | None = None, lT: torch.Tensor | None = None,
            logits: torch.Tensor | None = None, topk_ids: torch.Tensor | None = None,
            topk_logp: torch.Tensor | None = None, clip: float = 1.0) -> torch.Tensor:
    """The registered HindSearch divergence ``name`` reduced as the term reduces it (``agg``, token-mean):
    the scalar loss the tests check by hand, through the same functions training calls."""
    x = L.DistillInputs(lS=lS, lT=lT, logits=logits, topk_ids=topk_ids, topk_logp=topk_logp, signed_clip=clip)
    return L.agg(L.divergence(name).fn(x), mask)


def loss_from_full_logits(term, logits: torch.Tensor, completion_ids: torch.Tensor, inputs: dict) -> tuple:
    """``term.loss`` from full logits ``[B, T, V]``: the term's own positions selected first, as the trainer selects
    them from its hidden states (``aux_loss.selected_logits``)."""
    idx = term.positions(inputs, completion_ids.shape[1]).to(logits.device).nonzero()
    return term.loss(logits[idx[:, 0], idx[:, 1]], idx, completion_ids, inputs)


def distill_mask(traj, tokenizer, distill_on: str = "query") -> list[int]:
    """The tokens a hindsight term distils (0/1): ``teacher.distill_weights > 0``."""
    from hindsearch.hindsight.teacher import distill_weights

    return [int(w > 0) for w in distill_weights(traj, tokenizer, distill_on)]


def test_agg_modes_and_empty_mask():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, float("nan")]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert L.agg(loss, mask, "token-mean").item() == pytest.approx((1 + 2 + 4) / 3)
    assert L.agg(loss, mask, "sum").item() == pytest.approx(7.0)
    assert L.agg(loss, mask, "seq-mean-token-mean").item() == pytest.approx((1.5 + 4) / 2)
    assert L.agg(loss, mask, "seq-mean-token-sum").item() == pytest.approx((3 + 4) / 2)
    x = torch.randn(2, 3, requires_grad=True)
    z = L.agg(x, torch.zeros(2, 3))
    assert z.item() == 0.0 and z.requires_grad
    z.backward()
    assert torch.equal(x.grad, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="agg mode"):
        L.agg(loss, mask, "bogus")


def test_clamped_weight_and_hind_loss_hand_numbers():
    lS = torch.tensor([[-2.0, -1.0, -3.0, -0.5]], requires_grad=True)
    lT = torch.tensor([[-1.5, -2.0, -0.5, -0.5]])
    w = L.clamped_sampled_weight(lT, lS)
    assert w.tolist() == [[0.5, 0.0, 1.0, 0.0]]  # 0.5 | negative → 0 | 2.5 → clamped 1 | equal → 0
    assert not w.requires_grad
    mask = torch.tensor([[1, 1, 1, 0]])
    loss = distill("clamped_sampled", mask, lS, lT)
    # -(0.5*-2 + 0*-1 + 1*-3) / 3 = 4/3
    assert loss.item() == pytest.approx(4 / 3)
    loss.backward()
    assert lS.grad[0].tolist() == pytest.approx([-0.5 / 3, 0.0, -1 / 3, 0.0])


def test_teacher_equal_student_gives_zero_weight_and_loss():
    lS = torch.log_softmax(torch.randn(3, 7, 11), -1)[..., 0].requires_grad_(True)
    w = L.clamped_sampled_weight(lS.detach().clone(), lS)
    assert torch.count_nonzero(w) == 0
    loss = distill("clamped_sampled", torch.ones(3, 7), lS, lS.detach().clone())
    assert loss.item() == 0.0
    loss.backward()
    assert torch.count_nonzero(lS.grad) == 0


def test_empty_mask_exact_zero_no_nan():
    lS = torch.full((2, 4), -float("inf"), requires_grad=True)
    loss = distill("clamped_sampled", torch.zeros(2, 4), lS, torch.zeros(2, 4))
    assert loss.item() == 0.0
    logits = torch.randn(2, 4, 9, requires_grad=True)
    ids = torch.randint(0, 9, (2, 4, 3))
    for name in ("reverse_kl", "jsd"):
        z = distill(name, torch.zeros(2, 4), logits=logits, topk_ids=ids, topk_logp=torch.randn(2, 4, 3))
        assert z.item() == 0.0 and not torch.isnan(z)
    assert L.igsd_loss(torch.zeros(0), torch.zeros(0), torch.zeros(0)).item() == 0.0


def test_token_logprobs_matches_log_softmax():
    logits = torch.randn(2, 5, 13)
    ids = torch.randint(0, 13, (2, 5))
    ref = torch.log_softmax(logits, -1).gather(-1, ids[..., None])[..., 0]
    assert torch.allclose(L.token_logprobs(logits, ids), ref, atol=1e-6)


def test_topk_divergences_full_support_match_torch():
    """With the teacher's top-k covering the whole vocabulary the tail bucket is empty (hand numbers with a
    non-empty tail: tests/test_mechanism.py)."""
    # full support: reverse KL equals torch's KL(p_S || p_T)
    s, t = torch.randn(2, 3, 6), torch.randn(2, 3, 6)
    full = torch.arange(6).expand(2, 3, 6)
    ref = torch.nn.functional.kl_div(torch.log_softmax(t, -1), torch.log_softmax(s, -1), log_target=True, reduction="none").sum(-1)
    assert distill("reverse_kl", torch.ones(2, 3), logits=s, topk_ids=full, topk_logp=torch.log_softmax(t, -1)).item() == pytest.approx(ref.mean().item(), abs=1e-5)


def test_pair_probs_and_pair_kl_hand_numbers():
    p = L.pair_probs(torch.tensor([0.0, 2.0]), torch.tensor([0.0, 0.0]))
    assert p[0].tolist() == pytest.approx([0.5, 0.5])
    e = math.exp(2.0)
    assert p[1].tolist() == pytest.approx([e / (1 + e), 1 / (1 + e)])
    p_T = torch.tensor([[0.8, 0.2], [1.0, 0.0]])
    s = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]], requires_grad=True)  # p_S = (.5,.5), (.75,.25)
    kl = L.pair_kl(p_T, s)
    assert kl[0].item() == pytest.approx(0.8 * math.log(0.8 / 0.5) + 0.2 * math.log(0.2 / 0.5), abs=1e-6)
    assert kl[1].item() == pytest.approx(math.log(1 / 0.75), abs=1e-6)  # zero p_T entry contributes 0
    kl.sum().backward()
    assert torch.isfinite(s.grad).all()


def test_gate_kinds_hand_numbers_and_detached():
    d = torch.tensor([-1.0, 0.0, 0.2, 1.0], requires_grad=True)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert L.gate(d, "positive_sigmoid", 5.0, 0.0).tolist() == pytest.approx([0, 0, sig(1.0), sig(5.0)])
    assert L.gate(d, "sigmoid", 5.0, 0.0).tolist() == pytest.approx([sig(-5), 0.5, sig(1.0), sig(5.0)])
    assert L.gate(d, "hard", 5.0, 0.1).tolist() == [0, 0, 1, 1]
    assert L.gate(d, "none").tolist() == [1, 1, 1, 1]
    assert L.gate(d, "positive_sigmoid", 2.0, 0.5).tolist() == pytest.approx([0, 0, 0, sig(1.0)])
    for kind in L.GATES:
        assert not L.gate(d, kind).requires_grad
    with pytest.raises(ValueError):
        L.gate(d, "soft")


def test_igsd_loss_hand_numbers_and_none_is_ungated():
    p_T = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.5, 0.5]])
    s = torch.zeros(3, 2, requires_grad=True)
    kl = L.pair_kl(p_T, s)
    delta = torch.tensor([1.0, -1.0, 0.5])
    mask = torch.tensor([1.0, 1.0, 0.0])
    g = L.gate(delta, "positive_sigmoid", 5.0, 0.0)
    val = L.igsd_loss(g, kl, mask)
    assert val.item() == pytest.approx(g[0].item() * kl[0].item() / 2, abs=1e-7)
    ungated = L.igsd_loss(L.gate(delta, "none"), kl, mask)
    assert ungated.item() == pytest.approx((kl[0] + kl[1]).item() / 2, abs=1e-7)
    g_req = torch.ones(3, requires_grad=True)
    L.igsd_loss(g_req, kl, mask).backward()
    assert g_req.grad is None  # the gate never receives a gradient
