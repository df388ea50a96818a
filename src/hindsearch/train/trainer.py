"""``HindsearchGRPOTrainer``: a thin subclass of TRL 1.16's ``GRPOTrainer`` for search agents.

``L = L_GRPO + sum_k lam_k L_k``: TRL's loss as TRL computes it over our rollouts (``rollout_func``;
injected tokens masked through ``env_mask``), plus the hindsight terms (``hindsight.contract``) on
the logits of the same forward at the positions they ask for. The subclass receives the run's
engine, terms, reward functions and frozen/EMA copies, builds the one ``AuxContext`` of the run,
runs the terms' ``prepare`` after TRL's scoring, and logs through TRL's ``_metrics``
(``train.callbacks``). A non-finite loss raises ``NonFiniteLoss`` before ``backward``. With
``rollout.backend = vllm`` the engine decodes with TRL's vLLM engine (``train.vllm_glue``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from trl import GRPOTrainer

from hindsearch.fsutil import AtomicCheckpoints
from hindsearch.hindsight.registry import reduction_of
from hindsearch.records import QARecord, Trajectory
from hindsearch.train import rollout_adapter as ra
from hindsearch.train.aux_loss import (NonFiniteLoss, aux_key, checked_loss, checked_positions,
                                       selected_logits, term_inputs, update_shares)
from hindsearch.train import vllm_glue as vg
from hindsearch.hindsight.contract import AuxContext
from hindsearch.train.callbacks import (EMATeachers, FiniteWeights, MetricsWriter, SamplesWriter,
                                        StepTimer, gather_metrics)

class KeepWeights(TrainerCallback):
    """``train.keep_steps``: at each listed optimizer step, ``save_model`` into ``RUN/steps/step-N``
    (every process calls it, so sharded weights are gathered; a folder already there, from before a
    resume, is kept)."""

    def __init__(self, trainer: Any, steps: Sequence[int]) -> None:
        self.trainer, self.steps = trainer, set(steps)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in self.steps:
            out = self.trainer.run_dir / "steps" / f"step-{state.global_step}"
            if not (out / "config.json").exists():
                self.trainer.save_model(str(out))
                if self.trainer.accelerator.is_main_process:
                    self.trainer.processing_class.save_pretrained(str(out))


def _timed(timer: StepTimer, part: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """A TRL reward function whose calls add to ``timer``'s ``part`` (its name kept: TRL logs
    rewards by it), its answer checked (``reward_funcs.checked_reward``: one finite number or None
    per completion, errors naming it)."""
    import functools

    from hindsearch.train.reward_funcs import checked_reward

    check = checked_reward(func)

    @functools.wraps(func)
    def timed(*args: Any, **kwargs: Any) -> Any:
        with timer.part(part):
            return check(*args, **kwargs)

    return timed


def _units(term: Any, inputs: dict[str, torch.Tensor], C: int) -> torch.Tensor:
    """``[B, C]``: what a term's reduction counts per token: its ``unit_weights`` when it weights
    tokens, else its 0/1 positions."""
    weights = getattr(term, "unit_weights", None)
    return weights(inputs, C) if weights is not None else term.positions(inputs, C)


class HindsearchGRPOTrainer(AtomicCheckpoints, GRPOTrainer):
    """GRPO over multi-turn Search-R1 rollouts (+ optional hindsight terms); checkpoints saved
    atomically (``fsutil.AtomicCheckpoints``)."""

    def __init__(
        self,
        *,
        model: Any,
        args: Any,
        train_records: Sequence[QARecord],
        engine: Any,
        tokenizer: Any,
        terms: Sequence[Any] = (),
        frozen: Any = None,
        run_dir: str | Path | None = None,
        samples_per_step: int = 4,
        reward_funcs: Sequence[Any] = (),
        reward_weights: Sequence[float] | None = None,
        rollout_seed: int = 0,
        emas: Mapping[float, Any] | None = None,
        grad_share_steps: int = 10,
        grpo_scale: float = 1.0,
        keep_steps: Sequence[int] = (),
        **kwargs: Any,
    ) -> None:
        from datasets import Dataset

        if not train_records:
            raise ValueError("no training questions")
        self._by_key = {ra.record_key(r): r for r in train_records}
        if len(self._by_key) != len(train_records):
            raise ValueError("training record ids must be unique (they key the rollouts)")
        if not reward_funcs:
            raise ValueError("no reward function (train.reward_funcs)")
        if reward_weights is not None:
            args.reward_weights = list(reward_weights)
        dataset = Dataset.from_list([{"prompt": ra.record_key(r),
                                      "golden_answers": list(r.golden_answers)}
                                     for r in train_records])
        self.engine = engine
        self.terms = list(terms)
        # per term: its [B, T] positions of the generation batch
        self._step_positions: dict[str, torch.Tensor] = {}
        self.run_dir = Path(run_dir) if run_dir else None
        self.rollout_seed = rollout_seed
        self._last_trajs: list[Trajectory] = []
        self._vllm_attached = False
        self.grad_share_steps = grad_share_steps
        self.grpo_scale = float(grpo_scale)  # train.grpo_scale: 0 = the hindsight terms alone
        self.timer = StepTimer(self.record_metrics)
        if getattr(args, "use_vllm", False):
            self._apply_vllm_fields(args, engine)
        super().__init__(
            model=model,
            reward_funcs=[_timed(self.timer, "reward", f) for f in reward_funcs],
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            rollout_func=self._rollout,
            **kwargs,
        )
        self.samples_writer = SamplesWriter(self.run_dir, samples_per_step)
        # decay -> a full EMA copy of the policy (the terms with that ema_decay read it)
        emas = dict(emas or {})
        if emas and self.is_fsdp_enabled:
            raise ValueError("a term's teacher = 'ema' (hindsearch.teacher, igsd.teacher) is not "
                             "supported under FSDP; use 'frozen' or 'live', or DeepSpeed ZeRO-3")
        for cb in (self.timer, FiniteWeights(self.check_finite_weights),
                   MetricsWriter(self.run_dir), self.samples_writer,
                   *([EMATeachers(emas, self.accelerator)] if emas else [])):
            self.add_callback(cb)
        if keep_steps:
            bad = [s for s in keep_steps if not isinstance(s, int) or isinstance(s, bool) or s < 1]
            if bad or self.run_dir is None:
                raise ValueError("train.keep_steps must be optimizer steps >= 1 of a run with a "
                                 f"folder, got {list(keep_steps)}")
            self.add_callback(KeepWeights(self, keep_steps))
        # the object TRL trains (a PeftModel with LoRA)
        policy = self.accelerator.unwrap_model(self.model)
        if not self.use_vllm and engine.model is not policy:
            engine.use_model(policy)  # once: the rollouts decode what is trained
        # the one context of the run's terms (``step`` set before each prepare)
        self.aux_ctx: AuxContext | None = None
        if self.terms:
            # TRL's reference copy when it keeps one
            frozen = frozen if frozen is not None else self.ref_model
            for m in (frozen, *emas.values()):
                for p in m.parameters() if m is not None else ():
                    p.requires_grad_(False)
            self.aux_ctx = AuxContext(policy=policy, frozen=frozen, tokenizer=tokenizer,
                                      retriever=engine.retriever, complete=engine, topk=engine.topk,
                                      device=self.accelerator.device, emas=emas)

    # ------------------------------------------------------------------ rollouts
    def _rollout(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        """TRL's ``rollout_func``: one trajectory per prompt (timed as ``time/rollout``)."""
        with self.timer.part("rollout"):
            return self._rollout_inner(prompts)

    def _rollout_inner(self, prompts: list[Any]) -> dict[str, list]:
        from trl.models.utils import unwrap_model_for_generation

        records = ra.records_for_prompts(prompts, self._by_key)
        seed = self.rollout_seed * 1_000_003 + self.state.global_step
        if self.use_vllm:  # TRL has synced the weights into vLLM for this step (see the module doc)
            self._attach_vllm()
            vg.vllm_wake(self)
            st = self.engine.backend.stats
            n0, s0 = st["generated_tokens"], st["generate_s"]
            trajs = self.engine.rollout(records, num_generations=1, greedy=False, seed=seed)
            n, s = st["generated_tokens"] - n0, st["generate_s"] - s0
            self.record_metrics({"vllm/generated_tokens": float(n),
                                 "vllm/tokens_per_s": n / s if s > 0 else 0.0},
                                summed=lambda k: k == "vllm/generated_tokens")
        else:
            with unwrap_model_for_generation(
                self.model_wrapped, self.accelerator,
                gather_deepspeed3_params=self.args.ds3_gather_for_generation
            ) as unwrapped:
                was_training = unwrapped.training
                # the engine decodes this object (``aux_ctx.policy``, pointed at once)
                unwrapped.eval()
                try:
                    with torch.no_grad():
                        trajs = self.engine.rollout(records, num_generations=1,
                                                    greedy=False, seed=seed)
                finally:
                    unwrapped.train(was_training)
        if len(trajs) != len(prompts):
            raise RuntimeError(f"rollout engine returned {len(trajs)} trajectories for "
                               f"{len(prompts)} prompts")
        self._last_trajs = trajs
        tok = self.processing_class
        filler = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        return ra.rollout_output(trajs, filler,
                                 lambda ids: tok.decode(ids, skip_special_tokens=False))

    # the vLLM glue lives in train/vllm_glue.py
    _apply_vllm_fields = staticmethod(vg.apply_vllm_fields)

    def _attach_vllm(self) -> None:
        """Point the engine at TRL's vLLM, once (``vllm_glue.attach_vllm``)."""
        vg.attach_vllm(self)

    # ------------------------------------------------------------------ scoring + aux prepare
    # TRL 1.16 has no public hook that adds per-row tensors to the training batch: the terms'
    # prepare goes here
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.use_vllm:
            return self._score_and_prepare(inputs)
        try:
            out = self._score_and_prepare(inputs)
        finally:
            vg.vllm_sleep(self)
        if "old_per_token_logps" in out and "sampling_per_token_logps" in out:
            mask = (out["completion_mask"] * out["tool_mask"] if "tool_mask" in out
                    else out["completion_mask"])
            sums = ra.mismatch_sums(out["old_per_token_logps"], out["sampling_per_token_logps"],
                                    mask, float(self.args.vllm_importance_sampling_clip_max))
            sums = (self.accelerator.gather(sums[None]) if self.accelerator.num_processes > 1
                    else sums)
            # already global
            self._append_metrics({f"vllm/{k}": v for k, v in ra.mismatch_metrics(sums).items()})
        return out

    def _score_and_prepare(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """TRL's generation and scoring (our rollouts), then the aux terms' ``prepare``."""
        out = super()._generate_and_score_completions(inputs)
        trajs = self._last_trajs
        B, T = out["completion_ids"].shape
        device = out["completion_ids"].device
        out["hs_index"] = torch.arange(B, device=device)
        aux_samples: dict[str, list[dict]] = {}
        if self.terms and self.model.training:
            with self.timer.part("aux_prepare"):
                aux_samples = self._prepare_terms(trajs, out, B, T, device)
        rows = [ra.row_stats(t) for t in trajs]
        if self.accelerator.num_processes > 1:  # the statistics of the whole generation batch
            from accelerate.utils import gather_object

            rows = gather_object(rows)
        self._append_metrics({f"rollout/{k}": v
                              for k, v in ra.rollout_metrics(rows, self.num_generations).items()})
        # written when the optimizer step ends
        if self.accelerator.is_main_process and self.model.training:
            self.samples_writer.add(trajs, aux_samples, self.state.global_step + 1)
        return out

    def _prepare_terms(self, trajs: list[Trajectory], out: dict[str, Any], B: int, T: int,
                       device: torch.device) -> dict[str, list[dict]]:
        """Each term's ``prepare`` (no grad): its tensors into ``out`` under ``aux:<term>:<key>``,
        its metrics recorded; returns its per-trajectory samples by term name."""
        ctx = self.aux_ctx
        ctx.step = self.state.global_step  # the context's one per-step field
        aux_samples: dict[str, list[dict]] = {}
        metrics: dict[str, float] = {}
        for term in self.terms:
            with torch.no_grad():
                batch = term.prepare(trajs, T, ctx)
            for k, v in batch.tensors.items():
                if v.shape[0] != B:
                    raise RuntimeError(f"aux term {term.name!r}: tensor {k!r} has {v.shape[0]} "
                                       f"rows, batch is {B}")
                out[aux_key(term.name, k)] = v.to(device)
            # the step's positions of the term, row by row: micro-batches weight their loss by their
            # share of them
            self._step_positions[term.name] = _units(term, term_inputs(out, term.name), T).cpu()
            metrics.update({f"{term.name}/{k}": float(v) for k, v in batch.metrics.items()
                            if reduction_of(term, k)})
            aux_samples[term.name] = batch.samples
        self.record_metrics(metrics, summed=self._summed)
        return aux_samples

    def _summed(self, key: str) -> bool:
        """Whether the term metric ``<term>/<key>`` adds up over processes (``sum``), as its term
        declares (the trainer's own ``<term>/loss`` and ``<term>/grad_share`` are averaged)."""
        name, _, k = key.partition("/")
        if k in ("loss", "grad_share"):
            return False
        return reduction_of(next(t for t in self.terms if t.name == name), k) == "sum"

    # ------------------------------------------------------------------ loss
    @contextmanager
    def _capture_hidden(self, model: Any):
        """Collect the backbone's last hidden states of forwards run inside the block."""
        m = self.accelerator.unwrap_model(model)
        # peft (model.lora): a PeftModel's base_model is the LoRA wrapper
        if hasattr(m, "get_base_model"):
            m = m.get_base_model()
        base = m.base_model
        captured: list[torch.Tensor] = []

        def hook(_mod, _args, output):
            h = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
            captured.append(h)

        handle = base.register_forward_hook(hook)
        try:
            yield captured
        finally:
            handle.remove()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        from hindsearch.core import lockstep

        if not self.terms:
            grpo = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            loss = grpo * self.grpo_scale
        else:
            need = self._needed_positions(inputs)
            if not lockstep.active() and not bool(need.any()):
                # nothing to distil in this micro-batch, one process: exactly GRPO's forward and
                # backward (no hidden capture, no LM head, no gradient share); the terms' metrics
                # are their exact zeros
                grpo = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
                loss = grpo * self.grpo_scale
                self.record_metrics(self._idle_term_metrics(model, inputs), summed=self._summed)
            # a position to distil, or several processes: every rank runs the LM head, even on no
            # position
            else:
                loss = self._loss_with_terms(model, inputs, need, return_outputs,
                                             num_items_in_batch)
        if not torch.isfinite(loss.detach()).all():
            raise NonFiniteLoss(
                f"non-finite training loss ({float(loss.detach())}) at step "
                f"{self.state.global_step + 1}"
            )
        self.record_metrics({"loss/total": float(loss.detach())})
        return loss

    def _needed_positions(self, inputs: dict[str, Any]) -> torch.Tensor:
        """Bool ``[B, C]``: the union of the positions the terms distil in this micro-batch."""
        completion_ids = inputs["completion_ids"]
        C = completion_ids.size(1)
        need = torch.zeros(completion_ids.shape, dtype=torch.bool, device=completion_ids.device)
        for term in self.terms:
            pos = term.positions(term_inputs(inputs, term.name), C)
            need |= checked_positions(term, pos, tuple(need.shape)).to(need.device)
        return need

    def _loss_with_terms(self, model: Any, inputs: dict[str, Any], need: torch.Tensor,
                         return_outputs: bool, num_items_in_batch: Any) -> torch.Tensor:
        """TRL's loss plus ``sum_k lam_k L_k`` from the hidden states of TRL's own forward, the
        terms' metrics and, on a gradient-share step, ``<term>/grad_share``."""
        from hindsearch.core import lockstep

        with self._capture_hidden(model) as captured:
            grpo = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            loss = grpo * self.grpo_scale
        hidden = torch.cat(captured, dim=0) if len(captured) > 1 else captured[0]
        completion_ids = inputs["completion_ids"]
        lm_head = self.accelerator.unwrap_model(model).get_output_embeddings()
        logits, idx = selected_logits(hidden, lm_head, completion_ids.size(1), need)
        grpo_loss = loss
        weighted: list[tuple[str, torch.Tensor]] = []
        term_losses, metrics = self._term_losses(logits, idx, inputs)
        for term, term_loss in term_losses:
            w = self._micro_batch_weight(term, inputs, need.shape[1])
            loss = loss + term.lam * term_loss * w
            weighted.append((term.name, term.lam * term_loss * w))
        if self._grad_share_step() and self._grpo_has_gradient(inputs):
            if lockstep.any_rank(bool(need.any())):
                shares = update_shares(grpo_loss, weighted, captured)
                metrics.update({f"{name}/grad_share": v for name, v in shares.items()})
            # no term has a position on any process: every share is 0 (not two backwards to find it)
            else:
                metrics.update(self._zero_shares())
        self.record_metrics(metrics, summed=self._summed)
        return loss

    def _term_losses(self, logits: torch.Tensor, idx: torch.Tensor, inputs: dict[str, Any]
                     ) -> tuple[list[tuple[Any, torch.Tensor]], dict[str, float]]:
        """Each term's loss from the selected logits ``[N, V]`` at ``idx [N, 2]``, and the metrics
        every micro-batch logs of it (``<term>/loss`` and the term's own)."""
        out, metrics = [], {}
        for term in self.terms:
            term_loss, term_metrics = checked_loss(term,
                                                   term.loss(logits, idx, inputs["completion_ids"],
                                                                   term_inputs(inputs, term.name)))
            out.append((term, term_loss))
            metrics[f"{term.name}/loss"] = float(term_loss.detach())
            metrics.update({f"{term.name}/{k}": float(v) for k, v in term_metrics.items()
                            if reduction_of(term, k)})
        return out, metrics

    def _zero_shares(self) -> dict[str, float]:
        return {f"{term.name}/grad_share": 0.0 for term in self.terms}

    def _idle_term_metrics(self, model: Any, inputs: dict[str, Any]) -> dict[str, float]:
        """The metrics ``_loss_with_terms`` logs for a micro-batch without a position to distil:
        each term's loss and metrics on zero selected logits (its exact zeros), and a zero
        ``<term>/grad_share`` where a share is due."""
        device = inputs["completion_ids"].device
        weight = self.accelerator.unwrap_model(model).get_output_embeddings().weight
        logits = torch.zeros((0, weight.shape[0]), dtype=weight.dtype, device=device)
        _, metrics = self._term_losses(logits,
                                       torch.zeros((0, 2), dtype=torch.long, device=device), inputs)
        if self._grad_share_step() and self._grpo_has_gradient(inputs):
            metrics.update(self._zero_shares())
        return metrics

    def _grad_share_step(self) -> bool:
        """Whether this training step logs ``<term>/grad_share`` (every ``train.grad_share_steps``
        steps)."""
        return bool(self.grad_share_steps and self.model.training
                    and self.state.global_step % self.grad_share_steps == 0)

    def _grpo_has_gradient(self, inputs: dict[str, Any]) -> bool:
        """False when GRPO's loss has no gradient on any process: ``train.grpo_scale = 0``, or every
        advantage 0 (groups of equal rewards) without a KL term. ``<term>/grad_share`` is then
        skipped, not computed and thrown away (two extra backwards through the LM head). Decided
        over all processes (``lockstep.any_rank``), so that ranks run the same backwards."""
        from hindsearch.core import lockstep

        adv = inputs.get("advantages")
        mine = self.grpo_scale != 0.0 and (self.beta != 0.0 or adv is None
                                           or bool((adv != 0).any()))
        return lockstep.any_rank(mine)

    def _micro_batch_weight(self, term: Any, inputs: dict[str, Any], C: int) -> float:
        """This micro-batch's share of the term's units over the optimizer step
        (``losses.micro_batch_weight``); 1 outside training (one batch)."""
        from hindsearch.hindsight.losses import micro_batch_weight

        if not self.model.training or term.name not in self._step_positions:
            return 1.0
        mine = _units(term, term_inputs(inputs, term.name), C).cpu()
        return micro_batch_weight(mine, self._step_positions[term.name],
                                  getattr(term, "aggregation", "token-mean"))

    # ------------------------------------------------------------------ metrics (TRL's _metrics)
    def _append_metrics(self, metrics: Mapping[str, float]) -> None:
        """Append values (already global) to TRL's ``self._metrics[mode]``; TRL's ``log`` averages
        each key's values of the optimizer step (micro-batches) and writes them to ``logs``."""
        mode = "train" if self.model.training else "eval"
        for k, v in metrics.items():
            self._metrics[mode][k].append(float(v))

    def record_metrics(self, metrics: Mapping[str, float],
                       summed: Callable[[str], bool] = lambda _k: False) -> None:
        """This process's values, reduced over the processes (``gather_metrics``), into TRL's
        ``_metrics``."""
        self._append_metrics(gather_metrics(metrics, self.accelerator, summed))
