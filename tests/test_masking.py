"""Masking and aux-term wiring on TRL's own loss path (``HindsearchGRPOTrainer.compute_loss``).

- injected tokens (information blocks) carry no loss: the gradient of the GRPO loss (policy + KL) with
  respect to the backbone output is exactly zero at every position that predicts an injected token, and
  perturbing the logits there leaves the loss bit-identical, while perturbing one generated position
  changes it;
- aux terms get tensors sliced/shuffled consistently with TRL's rows and the logits of the same forward,
  aligned so ``logits[:, t]`` predicts ``completion_ids[:, t]``; ``L = L_GRPO + lam * L_aux``.
"""

from __future__ import annotations

import pytest
import torch
from test_trainer import OVERRIDES, make_trainer, tok, world  # noqa: F401 - fixtures

from hindsearch.config import Config
from hindsearch.hindsight.contract import AuxBatch, AuxContext
from hindsearch.hindsight.registry import Metrics


def backbone_perturbation(model, delta_fn):
    """Forward hook adding ``delta_fn(hidden)`` to the backbone's last hidden state (records the hidden)."""
    seen = []

    def hook(_m, _a, out):
        h = out.last_hidden_state
        if h.requires_grad:
            h.retain_grad()
        seen.append(h)
        d = delta_fn(h)
        if d is not None:
            out.last_hidden_state = h + d
        return out

    return model.base_model.register_forward_hook(hook), seen


def row(r):
    """A training dataset row as TRL's sampler yields it (the reward function reads ``golden_answers``)."""
    return {"prompt": r.id, "golden_answers": r.golden_answers}


def generation_inputs(trainer, records, g=2):
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop; we call the loss directly
    batch = [row(r) for r in records for _ in range(g)]
    return trainer._generate_and_score_completions(batch)


def test_grpo_loss_ignores_injected_positions(world, tok, tmp_path):  # noqa: F811
    w, retriever = world
    cfg = Config.load(None, OVERRIDES + ["train.kl_coef=0.04"])
    records = w.splits["train"][:4]
    trainer, model = make_trainer(cfg, tok, retriever, records, tmp_path / "run")
    # kl_coef > 0: TRL loads a reference model itself, from GRPOConfig.model_init_kwargs; Hub kernels stay off
    # there as on the policy (on the offline H200 it fetched kernels-community/rotary and failed every step)
    assert trainer.ref_model is not None and trainer.ref_model.use_kernels is False
    inputs = generation_inputs(trainer, records[:2])
    mask = inputs["completion_mask"] * inputs["tool_mask"]  # [B, C]
    assert (mask == 0).any() and (inputs["tool_mask"] == 0).any(), "no injected tokens in the batch"
    assert (inputs["advantages"] != 0).all()
    P, C = inputs["prompt_ids"].size(1), inputs["completion_ids"].size(1)

    handle, seen = backbone_perturbation(model, lambda h: None)
    loss = trainer.compute_loss(model, inputs)
    loss.backward()
    handle.remove()
    grad = seen[-1].grad[:, P - 1 : P + C - 1].abs().sum(-1)  # [B, C]: gradient at the position predicting token t
    assert (grad[mask == 0] == 0).all(), "an injected or padded token received gradient"
    assert (grad[mask == 1] > 0).all(), "a generated token received no gradient"
    base = loss.detach()

    def at(positions):
        def delta(h):
            d = torch.zeros_like(h)
            d[:, P - 1 : P + C - 1][positions] = 3.0 * torch.randn_like(d[:, P - 1 : P + C - 1][positions])
            return d

        return delta

    with torch.no_grad():
        handle, _ = backbone_perturbation(model, at(mask == 0))
        injected = trainer.compute_loss(model, inputs)
        handle.remove()
        one = torch.zeros_like(mask, dtype=torch.bool)
        b, t = (mask == 1).nonzero()[0].tolist()
        one[b, t] = True
        handle, _ = backbone_perturbation(model, at(one))
        generated = trainer.compute_loss(model, inputs)
        handle.remove()
    assert torch.equal(injected, base), "perturbing injected positions changed the loss"
    assert not torch.allclose(generated, base), "perturbing a generated position did not change the loss"


class ProbeTerm:
    """A real ``AuxTerm``: NLL of the completion under the captured logits, with consistency checks."""

    name, lam = "probe", 0.5
    metrics = Metrics(reductions={"rows": "sum", "tokens": "mean"}, loss="tokens")
    ema_decay = None

    def __init__(self, pad_id):
        self.pad_id, self.calls = pad_id, []

    def prepare(self, trajectories, completion_len, ctx):
        B = len(trajectories)
        ids = torch.full((B, completion_len), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, completion_len))
        for i, t in enumerate(trajectories):
            ids[i, : len(t.completion_ids)] = torch.tensor(t.completion_ids)
            mask[i, : len(t.gen_mask)] = torch.tensor(t.gen_mask, dtype=torch.float)
        return AuxBatch(tensors={"ids": ids, "mask": mask, "row": torch.arange(B)}, metrics={"rows": float(B)},
                        samples=[{"row": i} for i in range(B)])

    def positions(self, inputs, completion_len):
        return torch.ones(inputs["ids"].shape[0], completion_len, dtype=torch.bool)  # every position

    def loss(self, logits, idx, completion_ids, inputs):
        assert torch.equal(inputs["ids"], completion_ids), "aux tensors not sliced/shuffled with TRL's rows"
        B, C = completion_ids.shape
        assert logits.shape[0] == B * C and torch.equal(idx[:, 0] * C + idx[:, 1], torch.arange(B * C))  # row-major
        lp = logits.log_softmax(-1).gather(-1, completion_ids.reshape(-1, 1)).view(B, C)
        self.calls.append((lp.detach(), inputs["row"].clone()))
        m = inputs["mask"]
        return -(lp * m).sum() / m.sum().clamp(min=1), {"tokens": float(m.sum())}


def test_aux_term_gets_aligned_logits_of_the_same_forward(world, tok, tmp_path):  # noqa: F811
    w, retriever = world
    cfg = Config.load(None, OVERRIDES + ["train.kl_coef=0.0"])
    records = w.splits["train"][:4]
    trainer, model = make_trainer(cfg, tok, retriever, records, tmp_path / "run")
    probe = ProbeTerm(tok.pad_token_id)
    trainer.terms = [probe]
    trainer.aux_ctx = AuxContext(policy=model, frozen=None, tokenizer=tok, retriever=retriever,
                                 complete=trainer.engine, topk=cfg.retrieval.topk)
    torch.manual_seed(0)
    trainer.current_gradient_accumulation_steps = 1
    inputs = trainer._prepare_inputs([row(r) for r in records[:2] for _ in range(2)])  # shuffles rows
    assert sorted(inputs["aux:probe:row"].tolist()) == [0, 1, 2, 3]
    assert torch.equal(inputs["aux:probe:row"], inputs["hs_index"])

    n_before = len(probe.calls)
    total = trainer.compute_loss(model, inputs)
    lp, _ = probe.calls[n_before]
    trainer.terms = []
    grpo = trainer.compute_loss(model, inputs)
    m = inputs["aux:probe:mask"]
    lp_probe = -(lp * m).sum() / m.sum()
    assert torch.allclose(total, grpo + probe.lam * lp_probe, atol=1e-6)

    # the captured logits equal a plain (unfused) forward's logits at the completion positions
    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        C = inputs["completion_ids"].size(1)
        ref = model(input_ids=ids, attention_mask=att).logits[:, -C - 1 : -1].log_softmax(-1)
        ref = ref.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
    valid = inputs["completion_mask"].bool()
    assert torch.allclose(lp[valid], ref[valid], atol=1e-4)
    # the term's metrics went into TRL's own _metrics (averaged by TRL's log): prepare once, loss per compute_loss call with the term
    assert trainer._metrics["train"]["probe/rows"] == [4.0]
    assert trainer._metrics["train"]["probe/tokens"] == [float(m.sum())]  # the call with the term
    assert len(trainer._metrics["train"]["loss/total"]) == 2


class NaNTerm(ProbeTerm):
    name = "nan"

    def loss(self, logits, idx, completion_ids, inputs):
        return logits.sum() * float("nan"), {}


def test_non_finite_loss_stops_before_backward(world, tok, tmp_path):  # noqa: F811
    from hindsearch.train.aux_loss import NonFiniteLoss

    w, retriever = world
    cfg = Config.load(None, OVERRIDES + ["train.kl_coef=0.0"])
    records = w.splits["train"][:2]
    trainer, model = make_trainer(cfg, tok, retriever, records, tmp_path / "run")
    trainer.terms = [NaNTerm(tok.pad_token_id)]
    trainer.aux_ctx = AuxContext(policy=model, frozen=None, tokenizer=tok, retriever=retriever,
                                 complete=trainer.engine, topk=cfg.retrieval.topk)
    inputs = generation_inputs(trainer, records[:1])
    with pytest.raises(NonFiniteLoss, match="non-finite training loss"):
        trainer.compute_loss(model, inputs)
