"""Our hindsight divergences against TRL 1.16's own self-distillation code (SDPO / SDFT / GKD).

Where both define the same quantity, the values and the gradients w.r.t. the student logits must agree on random
inputs (several shapes, masks, temperatures). TRL's pure helpers (``trl.experimental.{sdpo,sdft}.loss_utils``,
byte-identical copies) are called directly; its trainer-level reductions are methods, called unbound on a
``SimpleNamespace`` holding only the attributes they read (no model, no trainer is built). Where the two differ
(support of the top-k, temperature, aggregation, clipping), the test pins the exact relation instead;
``docs/methods.md`` ("How HindSearch's losses relate to TRL's SDPO/SDFT") says why.
"""

from __future__ import annotations

import os
from collections import defaultdict
from types import SimpleNamespace

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import pytest
import torch
import torch.nn.functional as F
from trl.experimental.gkd.gkd_trainer import GKDTrainer
from trl.experimental.sdft import loss_utils as sdft_lu
from trl.experimental.sdft.sdft_trainer import SDFTTrainer
from trl.experimental.sdpo import loss_utils as sdpo_lu
from trl.experimental.sdpo.sdpo_trainer import DistillationLogits, SDPOTrainer

from hindsearch.hindsight import losses as L
from test_hindsight_losses import distill

LOSS_UTILS = pytest.mark.parametrize("lu", [sdpo_lu, sdft_lu], ids=["sdpo", "sdft"])
SHAPES = [(2, 5, 17, 4), (3, 7, 64, 10), (1, 3, 50, 49), (4, 6, 33, 1)]  # (B, T, V, k)
TEMPS = [1.0, 0.7, 1.5]
ATOL = 2e-5  # float32 throughout; the largest gap measured is 4e-6 (values and gradients)


@pytest.fixture(autouse=True)
def _seeded():
    """The random probes of the vector-Jacobian products are the same on every run."""
    torch.manual_seed(0)


def _logits(B: int, T: int, V: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, V, generator=g) * scale


def _teacher_topk(teacher_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``core.scoring.score_continuations`` stores: the teacher's top-k ids and their full-vocabulary log-probs."""
    v, ids = teacher_logits.topk(k, dim=-1)
    return ids, v - torch.logsumexp(teacher_logits, dim=-1, keepdim=True)


def _value_and_grad(fn, student_logits: torch.Tensor, probe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``fn(x)`` and ``d <probe, fn(x)> / dx`` (a random vector-Jacobian product: every entry's gradient counts)."""
    x = student_logits.detach().clone().requires_grad_(True)
    out = fn(x)
    (out * probe).sum().backward()
    return out.detach(), x.grad


def _assert_same(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor], atol: float = ATOL):
    torch.testing.assert_close(a[0], b[0], atol=atol, rtol=1e-5)
    torch.testing.assert_close(a[1], b[1], atol=atol, rtol=1e-5)


def _trl_teacher_support(lu, student_logits, topk_ids, teacher_topk_logp, alpha):
    """TRL's top-k divergence on the *teacher's* support with a tail bucket (the formula of
    ``_compute_server_distillation_loss``), from its own ``add_tail_bucket`` and ``compute_divergence``."""
    s = torch.gather(torch.log_softmax(student_logits, dim=-1), -1, topk_ids)
    return lu.compute_divergence(lu.add_tail_bucket(s), lu.add_tail_bucket(teacher_topk_logp), alpha)


# ---------------------------------------------------------------------------------------- tail bucket
# ------------------------------------------------------------------- top-k on the teacher's support
@LOSS_UTILS
@pytest.mark.parametrize("temperature", TEMPS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("alpha", [1.0, 0.5], ids=["reverse_kl", "jsd"])
def test_topk_divergence_equals_trl_on_teacher_support(lu, temperature, shape, alpha):
    """``reverse_kl`` = TRL ``alpha = 1`` and ``jsd`` = TRL ``alpha = 0.5``, tail bucket on, teacher's top-k ids.
    TRL scales both logits by ``1 / temperature``; ours gets the scaled logits here to show the same function."""
    B, T, V, k = shape
    s, t = _logits(B, T, V, 1) / temperature, _logits(B, T, V, 2) / temperature
    ids, tlp = _teacher_topk(t, k)
    probe = torch.randn(B, T)
    _assert_same(_value_and_grad(lambda x: L.topk_divergence_per_token(x, ids, tlp, alpha), s, probe),
                 _value_and_grad(lambda x: _trl_teacher_support(lu, x, ids, tlp, alpha), s, probe))


@pytest.mark.parametrize(("name", "alpha"), [("reverse_kl", 1.0), ("jsd", 0.5)])
def test_registered_divergences_equal_trl(name, alpha):
    """The registry entries the trainer calls, on ``[N, V]`` selected positions."""
    N, V, k = 23, 41, 7
    s, t = _logits(1, N, V, 3)[0], _logits(1, N, V, 4)[0]
    ids, tlp = _teacher_topk(t, k)
    dummy = torch.zeros(N)

    def ours(x):
        return L.divergence(name).fn(L.DistillInputs(lS=dummy, lT=dummy, logits=x, topk_ids=ids, topk_logp=tlp))

    probe = torch.randn(N)
    _assert_same(_value_and_grad(ours, s, probe),
                 _value_and_grad(lambda x: _trl_teacher_support(sdpo_lu, x, ids, tlp, alpha), s, probe))


# ------------------------------------------------------------------- top-k on the student's support
@LOSS_UTILS
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("alpha", [1.0, 0.5], ids=["reverse_kl", "jsd"])
def test_topk_equals_trl_student_support_when_supports_coincide(lu, shape, alpha):
    """TRL's local-teacher path (``compute_topk_self_distillation_loss``) takes the *student's* top-k ids. Where the
    two top-k sets are the same set, the k + 1 outcomes are the same and so is everything else."""
    B, T, V, k = shape
    t = _logits(B, T, V, 5)
    ids, _ = _teacher_topk(t, k)
    boost = torch.zeros_like(t).scatter(-1, ids, 8.0)  # the teacher's top-k ids lead both distributions
    t = t + boost
    s = t + 0.5 * _logits(B, T, V, 6, scale=1.0)
    ids, tlp = _teacher_topk(t, k)
    assert torch.equal(s.topk(k, dim=-1).indices.sort(-1).values, ids.sort(-1).values)
    probe = torch.randn(B, T)
    theirs = _value_and_grad(lambda x: lu.compute_topk_self_distillation_loss(
        x, t, distillation_topk=k, distillation_alpha=alpha, distillation_add_tail=True), s, probe)
    _assert_same(_value_and_grad(lambda x: L.topk_divergence_per_token(x, ids, tlp, alpha), s, probe), theirs)


def test_topk_differs_from_trl_student_support_when_supports_differ():
    """Different supports, different numbers: the teacher's top-k is not the student's (the doc says why ours)."""
    B, T, V, k = 2, 5, 40, 3
    s, t = _logits(B, T, V, 7), _logits(B, T, V, 8)
    ids, tlp = _teacher_topk(t, k)
    theirs = sdpo_lu.compute_topk_self_distillation_loss(
        s, t, distillation_topk=k, distillation_alpha=1.0, distillation_add_tail=True)
    assert (L.topk_divergence_per_token(s, ids, tlp, 1.0) - theirs).abs().max() > 1e-2


# ------------------------------------------------------------------------------- full vocabulary
@LOSS_UTILS
@pytest.mark.parametrize("temperature", TEMPS)
@pytest.mark.parametrize("alpha", [1.0, 0.5], ids=["reverse_kl", "jsd"])
def test_k_equal_vocab_is_trl_full_logit_divergence(lu, temperature, alpha):
    """With k = V the tail bucket is empty in both (the same clamped 1e-7, no gradient): TRL's ``full_logits``."""
    B, T, V = 3, 4, 29
    s, t = _logits(B, T, V, 9) / temperature, _logits(B, T, V, 10) / temperature
    ids, tlp = _teacher_topk(t, V)
    probe = torch.randn(B, T)
    # the tail is 1 - sum(p) over the whole vocabulary: float32 rounding of 1, clamped or not (1e-5 measured)
    _assert_same(_value_and_grad(lambda x: L.topk_divergence_per_token(x, ids, tlp, alpha), s, probe),
                 _value_and_grad(lambda x: lu.compute_full_logit_self_distillation_loss(
                     x, t, distillation_alpha=alpha), s, probe), atol=1e-4)


@pytest.mark.parametrize("temperature", TEMPS)
@pytest.mark.parametrize(("ours", "beta"), [("reverse_kl", 1.0), ("jsd", 0.5)], ids=["reverse_kl", "jsd"])
def test_token_mean_k_equal_vocab_is_gkd_generalized_jsd(temperature, ours, beta):
    """GKD's ``generalized_jsd_loss`` (its own temperature, ``labels = -100`` masking, ``batchmean`` = token mean)
    against ours at k = V on ``logits / temperature`` with ``agg(..., "token-mean")``."""
    B, T, V = 3, 6, 31
    s, t = _logits(B, T, V, 11), _logits(B, T, V, 12)
    mask = torch.rand(B, T, generator=torch.Generator().manual_seed(13)) > 0.4
    labels = torch.where(mask, torch.zeros(B, T, dtype=torch.long), torch.full((B, T), -100))
    ids, tlp = _teacher_topk(t / temperature, V)
    probe = torch.ones(())
    _assert_same(_value_and_grad(lambda x: distill(ours, mask, logits=x / temperature, topk_ids=ids, topk_logp=tlp), s, probe),
                 _value_and_grad(lambda x: GKDTrainer.generalized_jsd_loss(
                     x, t, labels=labels, beta=beta, temperature=temperature), s, probe))


# ------------------------------------------------------------------------------- sampled token
@LOSS_UTILS
@pytest.mark.parametrize("temperature", TEMPS)
@pytest.mark.parametrize("shape", SHAPES)
def test_signed_unclipped_is_trl_sampled_token(lu, temperature, shape):
    """TRL ``sampled_token``: ``(lS - lT).detach() * lS``; ours ``signed``: ``-clip(lT - lS, -c, c) * lS``. The same
    value and gradient whenever no gap is clipped (c = inf, or c >= every |lT - lS|)."""
    B, T, V, _ = shape
    s, t = _logits(B, T, V, 14) / temperature, _logits(B, T, V, 15) / temperature
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(16))
    lT = L.token_logprobs(t, ids)
    gap = (lT - L.token_logprobs(s, ids)).abs().max().item()
    probe = torch.randn(B, T)
    theirs = _value_and_grad(lambda x: lu.compute_sampled_token_self_distillation_loss(
        x, t, ids, distillation_alpha=1.0), s, probe)
    for clip in (float("inf"), gap + 1.0):
        ours = _value_and_grad(lambda x: -L.signed_advantage(lT, L.token_logprobs(x, ids), clip)
                               * L.token_logprobs(x, ids), s, probe)
        _assert_same(ours, theirs)


def test_signed_and_clamped_against_trl_sampled_token_where_they_differ():
    """Per token, with ``g = lT - lS``: ``signed`` (c = 1) equals TRL where ``|g| <= 1`` and caps the advantage
    elsewhere; ``clamped_sampled`` equals TRL where ``0 <= g <= 1``, is 0 where ``g < 0`` and caps at 1 above."""
    N, V = 400, 9
    s, t = _logits(1, N, V, 17)[0], _logits(1, N, V, 18)[0]
    ids = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(19))
    lT = L.token_logprobs(t, ids)
    x = s.clone().requires_grad_(True)
    lS = L.token_logprobs(x, ids)
    g = (lT - lS).detach()
    trl = sdpo_lu.compute_sampled_token_self_distillation_loss(x, t, ids, distillation_alpha=1.0)
    signed = L.divergence("signed").fn(L.DistillInputs(lS, lT, x, signed_clip=1.0))
    clamped = L.divergence("clamped_sampled").fn(L.DistillInputs(lS, lT, x))
    inside, pos = g.abs() <= 1, (g >= 0) & (g <= 1)
    assert inside.any() and (~inside).any() and (g < 0).any() and (g > 1).any()
    torch.testing.assert_close(signed[inside], trl[inside])
    torch.testing.assert_close(signed[~inside], -g[~inside].sign() * lS[~inside])
    torch.testing.assert_close(clamped[pos], trl[pos])
    assert torch.equal(clamped[g < 0], torch.zeros_like(clamped[g < 0]))
    torch.testing.assert_close(clamped[g > 1], -lS[g > 1])


# ------------------------------------------------------------------------------- IGSD pair KL
@LOSS_UTILS
def test_pair_kl_is_trl_forward_kl_on_renormalised_pair(lu):
    """IGSD's ``KL(p_T || p_S)`` on {b, a}: TRL ``alpha = 0`` (forward KL) on a support renormalised as its
    ``distillation_add_tail = False`` branch does (``lp - logsumexp(lp)``), here a 2-id support."""
    N, V = 50, 23
    s, t = _logits(1, N, V, 20)[0], _logits(1, N, V, 21)[0]
    pair = torch.stack([torch.randint(0, V, (N,)), torch.randint(0, V, (N,))], -1)
    pair[:, 1] = torch.where(pair[:, 1] == pair[:, 0], (pair[:, 0] + 1) % V, pair[:, 1])
    p_T = L.pair_probs(t.gather(-1, pair)[:, 0], t.gather(-1, pair)[:, 1])

    def renorm(lp):
        return lp - torch.logsumexp(lp, dim=-1, keepdim=True)

    probe = torch.randn(N)
    ours = _value_and_grad(lambda x: L.pair_kl(p_T, x.gather(-1, pair)), s, probe)
    theirs = _value_and_grad(lambda x: lu.compute_divergence(
        renorm(torch.log_softmax(x, -1).gather(-1, pair)), p_T.log(), 0.0), s, probe)
    _assert_same(ours, theirs)


# ------------------------------------------------------------------------------- TRL's reductions
def _fake_trainer(*, mode, alpha, k, student_logits, teacher, temperature=1.0):
    """The attributes TRL's distillation-loss methods read, and nothing else."""
    return SimpleNamespace(
        args=SimpleNamespace(distillation_mode=mode, distillation_alpha=alpha, distillation_topk=k,
                             distillation_add_tail=True, distillation_is_clip=None),
        state=SimpleNamespace(global_step=0), _last_loaded_step=0, num_loss_tokens_to_skip=0,
        accelerator=SimpleNamespace(gather=lambda v: v, wait_for_everyone=lambda: None),
        _metrics=defaultdict(lambda: defaultdict(list)), _log_self_distillation_metric=lambda *a: None,
        _forward_logits=lambda **kw: student_logits / temperature,
        _get_teacher_token_logprobs_from_server=lambda inputs, n: teacher,
    )


def _mask(B: int, T: int, seed: int, empty_rows: int) -> torch.Tensor:
    m = (torch.rand(B, T, generator=torch.Generator().manual_seed(seed)) > 0.3).long()
    m[:, 0] = 1
    m[:empty_rows] = 0
    return m


@pytest.mark.parametrize("cls", [SDPOTrainer, SDFTTrainer], ids=["sdpo", "sdft"])
@pytest.mark.parametrize("empty_rows", [0, 1])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize(("name", "mode", "alpha"),
                         [("reverse_kl", "topk_logits", 1.0), ("jsd", "topk_logits", 0.5),
                          ("signed", "sampled_token", 1.0)])
def test_trl_server_distillation_loss_is_ours_seq_mean(cls, empty_rows, temperature, name, mode, alpha):
    """TRL's server-teacher loss (teacher's top-k support, as ours) reduced its way: mean over the B rows of each
    row's token mean. That is our ``seq-mean-token-mean`` times (rows with a token) / B: equal when every row has
    one."""
    B, T, V, k = 4, 6, 37, 5
    raw = _logits(B, T, V, 22)
    t = _logits(B, T, V, 23) / temperature
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(24))
    top_ids, top_lp = _teacher_topk(t, k)
    lT = L.token_logprobs(t, ids)
    mask = _mask(B, T, 25, empty_rows)
    inputs = {"completion_ids": ids, "completion_mask": mask, "prompt_ids": torch.zeros(B, 2, dtype=torch.long),
              "prompt_mask": torch.ones(B, 2, dtype=torch.long)}
    teacher = {"actual_logprobs": lT, "topk_logprobs": top_lp, "topk_token_ids": top_ids}

    def theirs(x):
        fake = _fake_trainer(mode=mode, alpha=alpha, k=k, student_logits=x, teacher=teacher,
                             temperature=temperature)
        return cls._compute_server_distillation_loss(fake, SimpleNamespace(training=True), inputs)

    def ours(x):
        x = x / temperature
        lS = L.token_logprobs(x, ids)
        d = L.DistillInputs(lS, lT, x, topk_ids=top_ids, topk_logp=top_lp, signed_clip=float("inf"))
        rows = float((mask.sum(-1) > 0).sum()) / B
        return L.agg(L.divergence(name).fn(d), mask, "seq-mean-token-mean") * rows

    _assert_same(_value_and_grad(ours, raw, torch.ones(())), _value_and_grad(theirs, raw, torch.ones(())))


@pytest.mark.parametrize("cls", [SDPOTrainer, SDFTTrainer], ids=["sdpo", "sdft"])
@pytest.mark.parametrize(("name", "mode", "alpha", "k"),
                         [("reverse_kl", "full_logits", 1.0, None), ("jsd", "full_logits", 0.5, None),
                          ("signed", "sampled_token", 1.0, None)])
def test_trl_local_teacher_loss_is_ours_seq_mean(cls, name, mode, alpha, k):
    """TRL's local-teacher ``_compute_self_distillation_loss``: ``full_logits`` is ours at k = V, ``sampled_token``
    is ``signed`` unclipped; every row has a distilled token, so the reductions coincide."""
    B, T, V = 3, 5, 19
    s, t = _logits(B, T, V, 26), _logits(B, T, V, 27)
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(28))
    top_ids, top_lp = _teacher_topk(t, V)
    lT = L.token_logprobs(t, ids)
    mask = _mask(B, T, 29, 0)

    def theirs(x):
        fake = _fake_trainer(mode=mode, alpha=alpha, k=k, student_logits=x, teacher=None)
        dl = DistillationLogits(completion_ids=ids, completion_mask=mask, loss_mask=mask, student_logits=x,
                                teacher_logits=t)
        return cls._compute_self_distillation_loss(fake, SimpleNamespace(training=True), {}, dl)

    def ours(x):
        d = L.DistillInputs(L.token_logprobs(x, ids), lT, x, topk_ids=top_ids, topk_logp=top_lp,
                            signed_clip=float("inf"))
        return L.agg(L.divergence(name).fn(d), mask, "seq-mean-token-mean")

    _assert_same(_value_and_grad(ours, s, torch.ones(())), _value_and_grad(theirs, s, torch.ones(())))


def test_forward_kl_direction():
    """TRL's ``alpha`` convention (``F.kl_div(input, target)`` = KL(target || input)): 0 = KL(T || S), 1 = KL(S || T).
    Ours ``reverse_kl`` is KL(S || T); IGSD's pair KL is KL(T || S)."""
    s, t = torch.log_softmax(torch.randn(5, 8), -1), torch.log_softmax(torch.randn(5, 8), -1)
    kl = lambda p, q: (p.exp() * (p - q)).sum(-1)  # noqa: E731
    torch.testing.assert_close(sdpo_lu.compute_divergence(s, t, 1.0), kl(s, t))
    torch.testing.assert_close(sdpo_lu.compute_divergence(s, t, 0.0), kl(t, s))
    torch.testing.assert_close(F.kl_div(s, t, reduction="none", log_target=True).sum(-1), kl(t, s))
