"""One GRPO step and one SFT batch on a PEFT model, through ART's own tokenisation, packing and loss.

ART's ``tokenize_trajectory_groups`` turns groups into token rows with assistant masks, sampled logprobs and group
advantages; ``packed_tensors_from_tokenized_results`` packs them, a group's shared prompt once per packed row; and
``art.loss.loss_fn`` is the objective, so a trajectory trains here as it would on ART's GPU backend. What this
module adds is what ART's GPU trainer does around them: the packed attention mask, the new (and reference)
logprobs, and the optimizer step. SFT rows come from the same tokeniser with ``allow_training_without_logprobs``
(ART's own SFT tokeniser needs Unsloth): the loss is the mean negative log-likelihood of the assistant tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from itertools import takewhile
from typing import Any

import art
import torch
from art import dev
from art.loss import loss_fn
from art.preprocessing.pack import PackedTensors, packed_tensors_from_tokenized_results
from art.preprocessing.tokenize import TokenizedResult, tokenize_trajectory, tokenize_trajectory_groups
from art.trajectories import History
from openai.types.chat import ChatCompletionMessage, ChatCompletionTokenLogprob
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs

from environments.prompts import is_example
from service.backends import rl_measures
from service.backends.transformers import activation_memory, chat, shared_prefix
from service.backends.transformers.activation_memory import KeptActivations
from service.backends.transformers.precision import adapter_in_base_dtype

LOGPROB_CHUNK = 256  # positions whose vocabulary logits exist at once
# Packed-row tokens that go through one forward and backward: a math step's rows of 512 two at a time (most steps pack
# 1-2), an agent's longer rows one at a time. One pass over several rows makes fewer, larger products: 2 rows of 512
# trained in 0.86 of the time of a pass each (bench/train_pass.py, bf16, 2-core AMX Xeon). What a pass holds for its
# backward grows with its rows (the head's float32 log-softmax at every read position, above all): a pass of 4 rows
# peaked 0.56 GiB above a row at a time (measured once), and the main job's peak RSS is within 0.3 GiB of 3 GiB.
TRAIN_BATCH_TOKENS = 1024
# Rows that open alike count their opening once (shared_prefix.py). An agent's rows hold a few hundred read positions
# each (the head's float32 log-softmax, what a pass holds most of for its backward), where a math row's are most.
SHARED_BATCH_TOKENS = 4096


def packed_attention_mask(group_ids: torch.Tensor, parent_ids: torch.Tensor) -> torch.Tensor:
    """Which positions each position attends to in a packed row: earlier ones of its own sequence and of the
    shared prompt it continues (ART's ``calculate_mask``, which lives in its Unsloth trainer)."""
    length = group_ids.shape[1]
    causal = torch.tril(torch.ones(length, length, dtype=torch.bool, device=group_ids.device))
    same = group_ids.unsqueeze(2) == group_ids.unsqueeze(1)
    prompt = parent_ids.unsqueeze(2) == group_ids.unsqueeze(1)
    return causal & (same | prompt)


def token_logprobs(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor,
    *,
    entropy: bool = False,
    at: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of each next token (position t holds log p(tokens[t+1]); the last is 0), and optionally
    the entropy of each position's distribution. With ``at`` (a mask like ``tokens``) the head runs at those positions
    only and every other one reads 0: an RL row is an agent's whole episode, and its loss reads the replies alone."""
    hidden = _hidden(model, tokens, mask, positions)
    if at is None:
        everywhere = _head_logprobs(model, hidden.flatten(0, 1), _next_tokens(tokens).flatten(), entropy=entropy)
        return everywhere[0].view(tokens.shape), everywhere[1].view(tokens.shape) if entropy else None
    values, entropies = _head_logprobs(model, hidden[at], _next_tokens(tokens)[at], entropy=entropy)[:2]
    return _spread(values, at), _spread(entropies, at) if entropy else None


def policy_and_reference(
    model: Any, inputs: dict[str, torch.Tensor], mask: torch.Tensor, at: torch.Tensor, reference: str | None
) -> tuple[torch.Tensor, ...]:
    """An RL micro-batch's passes at the positions ``at``, each read as 0 elsewhere: the policy's log-probability of
    each next token and its entropy, the reference's log-probability (``reference_policy``) and the exact KL of the
    policy's distribution from the reference's. The reference's pass keeps only its hidden states at ``at``; its head
    runs beside the policy's, a chunk of positions at a time, so both distributions exist together."""
    tokens, positions = inputs["tokens"], inputs["input_pos"]
    with torch.no_grad(), reference_policy(model, reference):
        reference_hidden = _hidden(model, tokens, mask, positions)[at]
    hidden = _hidden(model, tokens, mask, positions)
    outputs = _head_logprobs(model, hidden[at], _next_tokens(tokens)[at], entropy=True,
                             reference=(reference_hidden, lambda: reference_policy(model, reference)))  # fmt: skip
    return tuple(_spread(values, at) for values in outputs)


def trained_logprobs(
    model: torch.nn.Module, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, trained: torch.Tensor
) -> torch.Tensor:
    """The next token's log-probability at the ``trained`` positions only, in their order. The vocabulary head is a
    fifth of SmolLM2's products at every position; a warm start trains a few replies after a long opening (an email
    demonstration: about 1 position in 9), so the head runs where the loss reads it."""
    hidden = _hidden(model, tokens, mask, positions)
    return _head_logprobs(model, hidden[trained], _next_tokens(tokens)[trained], entropy=False)[0]


def _spread(values: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """``values`` (one per true position of ``at``, in order) in a zero tensor shaped like ``at``; differentiable."""
    return values.new_zeros(at.shape).masked_scatter(at, values)


def read_positions(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The positions whose outputs ART's loss reads: the log-probability of a trained token or of one with a sampled
    logprob (``probs_corr``), both shifted by one as the loss shifts them, and the entropy, which the loss shifts once
    more (it reads a trained token's own position)."""
    trained = inputs["assistant_mask"].bool()
    shifted = torch.nn.functional.pad(trained[:, 1:], (0, 1), value=False)
    sampled = torch.nn.functional.pad(~torch.isnan(inputs["logprobs"][:, 1:]), (0, 1), value=False)
    return shifted | sampled | trained


def _hidden(model: torch.nn.Module, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The backbone's last hidden states; an opening every row holds alike is computed once (shared_prefix.py)."""
    with adapter_in_base_dtype(model):
        if not shared_prefix.applies(model):  # CUDA's sdpa
            return _backbone(model)(input_ids=tokens.clamp(min=0), attention_mask=mask.unsqueeze(1),
                                    position_ids=positions, use_cache=False).last_hidden_state  # fmt: skip
        if length := shared_prefix.shared_length(tokens, positions, mask):
            return shared_prefix.hidden_states(_backbone(model), tokens, mask, positions, length)
        return shared_prefix.run(_backbone(model), tokens, mask, positions)


def micro_batches(tokens: torch.Tensor, positions: torch.Tensor) -> list[slice]:
    """The packed rows in runs of at most TRAIN_BATCH_TOKENS tokens, one row at least; rows that open alike (an agent's
    episodes) in runs of at most SHARED_BATCH_TOKENS computed positions, their opening counted once a run."""
    rows, width = tokens.shape
    shared = shared_prefix.alike_length(tokens, positions)
    if shared >= shared_prefix.MIN_SHARED:
        per = max(1, (SHARED_BATCH_TOKENS - shared) // (width - shared))
    else:
        per = max(1, TRAIN_BATCH_TOKENS // max(width, 1))
    return [slice(start, min(start + per, rows)) for start in range(0, rows, per)]


def _next_tokens(tokens: torch.Tensor) -> torch.Tensor:
    """What each position predicts: the token after it (padding read as token 0; the last position, 0)."""
    return torch.nn.functional.pad(tokens[:, 1:].clamp(min=0), (0, 1))


def _head_logprobs(
    model: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    *,
    entropy: bool,
    reference: tuple[torch.Tensor, Callable[[], AbstractContextManager[None]]] | None = None,
) -> tuple[torch.Tensor, ...]:
    """Each row of ``hidden`` (positions × width): the log-probability of its target, and its entropy if asked (else
    empty); the vocabulary logits exist a chunk of positions at a time. With ``reference`` (the reference's hidden
    states at the same positions, and a context in which the model computes as the reference) also the reference's
    log-probability of each target and each position's exact KL from the reference (rl_measures.exact_kl)."""
    head = model.get_output_embeddings()
    outputs: tuple[list[torch.Tensor], ...] = ([], [], [], [])
    for start in range(0, hidden.shape[0], LOGPROB_CHUNK):
        part, chosen = slice(start, start + LOGPROB_CHUNK), targets[start : start + LOGPROB_CHUNK].unsqueeze(-1)
        log_softmax = torch.log_softmax(head(hidden[part]).float(), dim=-1)
        outputs[0].append(log_softmax.gather(-1, chosen).squeeze(-1))
        if entropy:
            outputs[1].append(-(log_softmax.exp() * log_softmax).sum(-1).detach())
        if reference is not None:
            with torch.no_grad(), reference[1]():
                referenced = torch.log_softmax(head(reference[0][part]).float(), dim=-1)
            outputs[2].append(referenced.gather(-1, chosen).squeeze(-1))
            outputs[3].append(rl_measures.exact_kl(log_softmax.detach(), referenced))
    if not outputs[0]:  # no positions
        return tuple(hidden.new_zeros(0, dtype=torch.float32) for _ in outputs)
    return tuple(torch.cat(values) if values else torch.empty(0) for values in outputs)


def _backbone(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack under the LM head (through PEFT's wrappers)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.model


def tokenize_groups(tokenizer: Any, groups: list[art.TrajectoryGroup], *, scale_rewards: bool) -> list[TokenizedResult]:
    groups = [art.TrajectoryGroup([_calls_written_once(t) for t in group]) for group in groups]
    return list(
        tokenize_trajectory_groups(tokenizer, groups, allow_training_without_logprobs=False, scale_rewards=scale_rewards)
    )


def _calls_written_once(trajectory: art.Trajectory) -> art.Trajectory:
    """``trajectory`` with its sampled replies' parsed tool calls dropped from their messages: a sampled reply's
    tokens already hold its calls as it wrote them. ART's tokeniser renders the template's copy of the calls after
    the reply's tokens for every reply but the last (the last it strips itself), so an episode's earlier calls
    would stand in the row twice and every later turn would train on a context the policy never saw."""
    histories = [History(messages_and_choices=_without_parsed_calls(h.messages_and_choices), tools=h.tools)
                 for h in trajectory.additional_histories]  # fmt: skip
    return trajectory.model_copy(update={
        "messages_and_choices": _without_parsed_calls(trajectory.messages_and_choices),
        "additional_histories": histories})  # fmt: skip


def _without_parsed_calls(items: art.MessagesAndChoices) -> art.MessagesAndChoices:
    return [item.model_copy(update={"message": item.message.model_copy(update={"tool_calls": None})})
            if isinstance(item, Choice) and item.logprobs is not None and item.message.tool_calls else item
            for item in items]  # fmt: skip


class SequenceTooLong(ValueError):
    """A trajectory longer than the backend may train on in one row."""


def pack(
    results: list[TokenizedResult], *, seq_len: int, advantage_balance: float = 0.0, max_tokens: int | None = None
) -> PackedTensors:
    """ART's packing into rows of ``seq_len`` tokens, or of the longest trajectory where that is longer, with the
    columns that are padding in every row cut off (a small step is not padded to a full row).

    A trajectory is never cut: ART's packing cuts one longer than its row, and an agent's episode is longer than a
    math row before its first reply (an email episode's opening and tools: about 850 tokens). Cut at 512, its
    replies were not trained at all. So a row's cost follows its longest trajectory: ``max_tokens`` bounds it
    (SequenceTooLong beyond; the trajectories a client posts). ``advantage_balance`` is ART's (-1 to 1)."""
    longest = max(len(result.token_ids) for result in results)
    if max_tokens is not None and longest > max_tokens:
        raise SequenceTooLong(f"a trajectory of {longest} tokens is longer than this server trains ({max_tokens})")
    packed = packed_tensors_from_tokenized_results(results, seq_len=max(seq_len, longest), pad_token_id=-100,
                                                   verbosity=0, advantage_balance=advantage_balance)  # fmt: skip
    used = int((packed["group_ids"] != -1).any(dim=0).nonzero().max()) + 1
    return {k: v[:, :used] if isinstance(v, torch.Tensor) else v for k, v in packed.items()}  # type: ignore[return-value]


def grpo_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    packed: PackedTensors,
    *,
    learning_rate: float,
    config: dev.TrainConfig,
    max_grad_norm: float,
    reference: str | None = None,
    kept: KeptActivations | None = None,
) -> dict[str, float]:
    """Accumulate ART's loss over the packed rows (weighted by their assistant tokens, so the step's loss is the
    mean over all of them), then one optimizer step. Reports loss, entropy, the exact KL to the reference (the adapter
    named ``reference``, or the base model with the adapter disabled), ``probs_corr`` and the gradient norm. A pass
    keeps the activations of as many layers as ``kept`` allows (None: every checkpointed layer recomputes them)."""
    device = next(model.parameters()).device
    rows = packed["tokens"].shape[0]
    total = float(packed["assistant_mask"].sum()) or 1.0
    sums = {"loss": 0.0, "entropy": 0.0, "kl_policy_ref": 0.0}
    sampled: list[torch.Tensor] = []
    optimizer.zero_grad(set_to_none=True)
    model.train()
    with adapter_in_base_dtype(model):  # the backward recomputes checkpointed layers under the forward's rule
        for batch in micro_batches(packed["tokens"], packed["input_pos"]):
            inputs = {k: v[batch].to(device) for k, v in packed.items() if isinstance(v, torch.Tensor)}
            mask = packed_attention_mask(inputs["group_ids"], inputs["parent_ids"])
            read = read_positions(inputs)
            with activation_memory.around_pass(kept, model, inputs, mask):
                new, entropies, referenced, kl = policy_and_reference(model, inputs, mask, read, reference)
                # ART's loss outside the adapter's autocast, in float32, as ART runs it
                with torch.autocast(device.type, enabled=False):
                    loss = loss_fn(inputs, new, referenced, entropies, config)  # type: ignore[arg-type]
                share = float(inputs["assistant_mask"].sum()) / total  # ART's loss is a mean over the batch's tokens
                (loss.policy_loss * share).backward()
            sums["loss"] += loss.policy_loss.item() * share
            sums["entropy"] += float(loss.entropy or 0.0) * share
            sums["kl_policy_ref"] += rl_measures.mean_over_trained(kl, inputs["assistant_mask"]) * share
            sampled.append(rl_measures.sampled_probs(inputs, new.detach()))
    grad_norm = _step(model, optimizer, learning_rate, max_grad_norm)
    model.eval()
    corr = rl_measures.probs_corr(sampled)
    return {**sums, **({} if corr is None else {"probs_corr": corr}), "grad_norm": grad_norm,
            "packed_rows": float(rows), "trained_tokens": total}  # fmt: skip


@contextmanager
def reference_policy(model: Any, adapter: str | None) -> Iterator[None]:
    """Within it the model computes as the KL reference: the adapter ``adapter`` (then "default" again: PEFT makes
    the active adapter the trainable one), or the base model."""
    if adapter is None:
        with model.disable_adapter():
            yield
        return
    model.set_adapter(adapter)
    try:
        yield
    finally:
        model.set_adapter("default")


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, learning_rate: float, max_grad_norm: float) -> float:
    for group in optimizer.param_groups:
        group["lr"] = learning_rate
    trainable = [p for p in model.parameters() if p.requires_grad]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(trainable, max_grad_norm))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def sft_rows(tokenizer: Any, trajectories: list[art.Trajectory]) -> list[TokenizedResult]:
    """Each trajectory's tokens with its assistant replies masked in, by ART's tokeniser; few-shot example replies
    (part of the opening, not the policy's) are masked out again."""
    rows = []
    for trajectory in trajectories:
        history = History(messages_and_choices=_calls_as_written(tokenizer, trajectory), tools=trajectory.tools)
        row = tokenize_trajectory(tokenizer, None, history, 1.0, True, trajectory)
        if row is not None:
            examples = sum(1 for m in trajectory.messages_and_choices if isinstance(m, dict) and is_example(m)
                           and m.get("role") == "assistant")  # fmt: skip
            row.assistant_mask = _without_first_spans(row.assistant_mask, examples)
            rows.append(row)
    return rows


def _calls_as_written(tokenizer: Any, trajectory: art.Trajectory) -> art.MessagesAndChoices:
    """The demonstration's messages, each reply that makes tool calls as a choice holding the tokens a policy writes
    for it (``chat.reply_token_ids``). ART tokenises a reply message by encoding its content alone and refuses one
    with calls; a choice's tokens it takes as they are."""
    return [_written(tokenizer, item, trajectory.tools)
            if isinstance(item, dict) and item.get("role") == "assistant" and item.get("tool_calls")
            and not is_example(item) else item
            for item in trajectory.messages_and_choices]  # fmt: skip


def _written(tokenizer: Any, message: dict[str, Any], tools: Any) -> Choice:
    tokens = [ChatCompletionTokenLogprob(token=f"token_id:{token}", logprob=math.nan, bytes=None, top_logprobs=[])
              for token in chat.reply_token_ids(tokenizer, message, tools)]  # fmt: skip
    return Choice(index=0, finish_reason="tool_calls", message=ChatCompletionMessage(role="assistant", content=None),
                  logprobs=ChoiceLogprobs(content=tokens))  # fmt: skip


def pack_sft(rows: list[TokenizedResult]) -> PackedTensors:
    """The rows packed by ART's packing, their common opening (an email demonstration's system prompt and tools,
    about half its tokens) held once a packed row and continued by each row's own tokens, as ART packs a group's
    rollouts after their shared prompt. Marked as ART's ``tokenize_trajectory_groups`` marks a group: one token
    short of the common prefix and of any trained token, so every continuation starts on a token it does not train
    on. A packed row is as wide as the longest demonstration: every packed row then opens alike, and a pass computes
    that opening once for several rows (shared_prefix.py). Rows of 2,048 held more demonstrations each, but their dense
    mask cost more than it saved: a 14-demonstration batch took 75.7 s so and 60.0 s this way
    (bench/warm_start_packing.py)."""
    common = len(list(takewhile(lambda column: len(set(column)) == 1, zip(*(r.token_ids for r in rows)))))
    first_trained = min((r.assistant_mask.index(1) for r in rows if 1 in r.assistant_mask), default=common)
    for row in rows:
        row.prompt_id, row.prompt_length = 0, max(min(common, first_trained) - 1, 0)
    return pack(rows, seq_len=0)


def _without_first_spans(mask: list[int], count: int) -> list[int]:
    """``mask`` with its first ``count`` runs of ones (one per assistant message, in order) set to zero."""
    out, seen, previous = list(mask), 0, 0
    for i, bit in enumerate(mask):
        if bit and not previous:
            seen += 1
        if bit and seen <= count:
            out[i] = 0
        previous = bit
    return out


def sft_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, rows: list[TokenizedResult], *, learning_rate: float,
    max_grad_norm: float, kept: KeptActivations | None = None,
) -> dict[str, float]:
    """One optimizer step of next-token loss on the rows' assistant tokens, the rows packed with their common
    opening once a packed row (``pack_sft``); a pass keeps the activations of as many layers as ``kept`` allows."""
    device = next(model.parameters()).device
    packed = pack_sft(rows)
    targets = torch.nn.functional.pad(packed["assistant_mask"][:, 1:], (0, 1))  # position t predicts token t + 1
    tokens_total = int(targets.sum()) or 1
    optimizer.zero_grad(set_to_none=True)
    model.train()
    loss_sum = 0.0
    with adapter_in_base_dtype(model):  # the backward recomputes checkpointed layers under the forward's rule
        for batch in micro_batches(packed["tokens"], packed["input_pos"]):
            inputs = {k: v[batch].to(device) for k, v in packed.items() if isinstance(v, torch.Tensor)}
            mask = packed_attention_mask(inputs["group_ids"], inputs["parent_ids"])
            trained = targets[batch].to(device)
            with activation_memory.around_pass(kept, model, inputs, mask):
                loss = -trained_logprobs(model, inputs["tokens"], mask, inputs["input_pos"], trained).sum() / tokens_total
                loss.backward()
            loss_sum += float(loss.detach())
    grad_norm = _step(model, optimizer, learning_rate, max_grad_norm)
    model.eval()
    return {"loss": loss_sum, "grad_norm": grad_norm, "trained_tokens": float(tokens_total)}


def kept_bytes(model: torch.nn.Module, kind: str) -> tuple[float, float]:
    """What one layer of ``model`` keeps for its backward in a training pass of ``kind`` (activation_memory.measure),
    measured on this module's passes."""

    def run(tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> None:
        with adapter_in_base_dtype(model):
            _hidden(model, tokens, mask, positions)

    return activation_memory.measure(model, kind, run, packed_attention_mask)
