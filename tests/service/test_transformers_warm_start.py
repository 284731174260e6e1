"""The transformers backend's warm start on demonstrations that call tools (the email agent's teacher): ART's
tokeniser refuses a reply message with calls, so each becomes the tokens a policy writes for it, and the rows train
on the prompts the policy will be sampled from."""

from __future__ import annotations

import pytest
import torch

from environments.email.env import EmailEnvironment
from service.backends.transformers import chat, shared_prefix, training
from service.backends.transformers.activation_memory import KeptActivations, checkpointed_layers


@pytest.fixture(scope="module")
def engine(tiny_lm, tmp_path_factory):
    from service.backends.transformers.engine import LoraSettings, PolicyEngine

    return PolicyEngine(tmp_path_factory.mktemp("warm") / "model", tiny_lm, lora=LoraSettings(rank=8))


def _demos(count: int) -> list:
    return list(EmailEnvironment().demonstrations(seed=0, count=count))


def _as_the_server_sees_it(tokenizer, message: dict, tools) -> dict:
    """An assistant message as the server returns it once a policy has written it: its text parsed back into calls."""
    text = tokenizer.decode(chat.reply_token_ids(tokenizer, message, tools), skip_special_tokens=True)
    parsed = chat.parse_tool_calls(text, call_id_prefix="c")
    return {"role": "assistant", "content": parsed.content, "tool_calls": parsed.tool_calls}


def test_a_demonstrations_calls_train_as_a_policy_writes_them_on_the_prompts_it_will_see(engine):
    tokenizer = engine.tokenizer
    [demo] = _demos(1)
    [row] = training.sft_rows(tokenizer, [demo])
    replies = [m for m in demo.messages_and_choices if isinstance(m, dict) and m.get("role") == "assistant"]
    assert len(replies) >= 2 and all(m["tool_calls"] for m in replies)

    written = [chat.reply_token_ids(tokenizer, m, demo.tools) for m in replies]
    assert [t for t, m in zip(row.token_ids, row.assistant_mask) if m] == [t for w in written for t in w]
    text = tokenizer.decode(row.token_ids).split("<|im_start|>user", 1)[1]
    assert text.count("<tool_call>") == len(replies)
    assert text.count("<|im_start|>assistant\n<tool_call>\n{\"name\": ") == len(replies)  # as the policy writes one
    for k, reply in enumerate(replies):  # each reply trains on the prompt the server renders for its turn
        before = demo.messages_and_choices[: demo.messages_and_choices.index(reply)]
        seen = [_as_the_server_sees_it(tokenizer, m, demo.tools) if m.get("role") == "assistant" else m for m in before]
        prompt = chat.render_prompt(tokenizer, seen, chat.tools_as_trained(demo.tools))
        assert row.token_ids[: len(prompt)] == prompt, k
        assert row.token_ids[len(prompt) : len(prompt) + len(written[k])] == written[k]


def _demos_nll(engine, rows) -> float:
    """Mean negative log-likelihood of the rows' assistant tokens under the engine's policy."""
    total, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            tokens = torch.tensor([row.token_ids])
            causal = torch.tril(torch.ones(len(row.token_ids), len(row.token_ids), dtype=torch.bool)).unsqueeze(0)
            logprobs, _ = training.token_logprobs(engine.model, tokens, causal, torch.arange(len(row.token_ids))[None])
            target = torch.tensor(row.assistant_mask[1:] + [0], dtype=torch.bool)
            total, count = total - float(logprobs[0][target].sum()), count + int(target.sum())
    return total / count


def test_the_warm_start_makes_the_teachers_tool_calls_likelier(engine):
    demos = _demos(2)
    rows = training.sft_rows(engine.tokenizer, demos)
    curve = [_demos_nll(engine, rows)]
    for _ in range(3):
        engine.sft_step(demos, learning_rate=3e-3)
        curve.append(_demos_nll(engine, rows))
    # the random tiny model starts near ln(49,152) = 10.8 nats a token; each step lowers it (0.1 the first)
    assert all(later < earlier for earlier, later in zip(curve, curve[1:])) and curve[-1] < curve[0] - 0.15, curve


def test_packed_demonstrations_hold_their_opening_once_and_score_as_each_would_alone(tiny_lm):
    from transformers import AutoModelForCausalLM

    from service.backends.transformers.models import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_lm), dtype=torch.float32).eval()  # float32: exact to 1e-5
    tokenizer = load_tokenizer(tiny_lm)
    chat.add_tool_support(tokenizer)
    rows = training.sft_rows(tokenizer, _demos(3))
    packed = training.pack_sft(rows)
    opening, packed_rows = rows[0].prompt_length, packed["tokens"].shape[0]
    assert opening > 300 and packed_rows <= len(rows)  # the system prompt and tools, once a packed row
    # every packed row opens alike, so a training pass computes the opening once for all of them (shared_prefix.py)
    assert shared_prefix.alike_length(packed["tokens"], packed["input_pos"]) >= opening
    held = int((packed["group_ids"] != -1).sum())
    assert held == sum(len(r.token_ids) for r in rows) - (len(rows) - packed_rows) * opening

    alone, together = {}, {}
    with torch.no_grad():
        for row in rows:
            tokens = torch.tensor([row.token_ids])
            causal = torch.tril(torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool)).unsqueeze(0)
            logprobs, _ = training.token_logprobs(model, tokens, causal, torch.arange(tokens.shape[1])[None])
            mask = torch.tensor(row.assistant_mask, dtype=torch.bool)
            reply = tuple(t for t, m in zip(row.token_ids, row.assistant_mask) if m)
            alone[reply] = logprobs[0][:-1][mask[1:]].tolist()
        for i in range(packed["tokens"].shape[0]):
            inputs = {k: v[i : i + 1] for k, v in packed.items() if isinstance(v, torch.Tensor)}
            mask = training.packed_attention_mask(inputs["group_ids"], inputs["parent_ids"])
            logprobs, _ = training.token_logprobs(model, inputs["tokens"], mask, inputs["input_pos"])
            trained = torch.nn.functional.pad(inputs["assistant_mask"][:, 1:], (0, 1))
            only = training.trained_logprobs(model, inputs["tokens"], mask, inputs["input_pos"], trained)
            assert only.tolist() == pytest.approx(logprobs[trained].tolist(), abs=1e-5)  # the head where it is read
            none = training.trained_logprobs(model, inputs["tokens"], mask, inputs["input_pos"], trained & False)
            assert none.shape == (0,)  # a row with nothing to train gives nothing, not an error
            for group in inputs["group_ids"][0].unique():  # one demonstration's own tokens (its opening is shared)
                own = (inputs["group_ids"][0] == group) & inputs["assistant_mask"][0]
                positions = own.nonzero().squeeze(1)
                together[tuple(inputs["tokens"][0][positions].tolist())] = logprobs[0][positions - 1].tolist()
    together.pop((), None)
    assert together.keys() == alone.keys() and len(alone) == 3
    for reply, values in alone.items():
        assert together[reply] == pytest.approx(values, abs=1e-5)


def test_the_warm_start_becomes_the_kl_reference_and_a_restarted_engine_loads_it_again(tiny_lm, tmp_path):
    from service.backends.transformers.engine import LoraSettings, PolicyEngine

    engine = PolicyEngine(tmp_path / "model", tiny_lm, lora=LoraSettings(rank=8))
    assert engine.reference is None  # no warm start: the KL is to the base model
    demos = _demos(2)
    rows = training.sft_rows(engine.tokenizer, demos)
    with training.reference_policy(engine.model, None):
        base = _demos_nll(engine, rows)
    engine.sft_step(demos, learning_rate=3e-3)
    engine.finish_sft()
    warm = _demos_nll(engine, rows)
    engine.sft_step(demos, learning_rate=3e-3)  # the policy moves on, as RL moves it
    engine.save_checkpoint()
    with training.reference_policy(engine.model, engine.reference):
        assert _demos_nll(engine, rows) == pytest.approx(warm, abs=1e-6)
    assert _demos_nll(engine, rows) < warm < base
    # a checkpoint holds the trained adapter alone, not the reference beside it
    assert not (tmp_path / "model" / "checkpoints" / "0000" / engine.reference).exists()

    again = PolicyEngine(tmp_path / "model", tiny_lm, lora=LoraSettings(rank=8))
    with training.reference_policy(again.model, again.reference):
        assert _demos_nll(again, rows) == pytest.approx(warm, abs=1e-6)
    assert _demos_nll(again, rows) == pytest.approx(_demos_nll(engine, rows), abs=1e-6)
    assert [p for p in again.model.parameters() if p.requires_grad] and all(
        "default" in name for name, p in again.model.named_parameters() if p.requires_grad)


def test_a_warm_start_pass_keeps_the_activations_its_budget_holds_and_trains_as_one_that_recomputes_them(
    tiny_lm, tmp_path
):
    from service.backends.transformers.engine import LoraSettings, PolicyEngine

    engine = PolicyEngine(tmp_path / "model", tiny_lm, lora=LoraSettings(rank=8), dtype=torch.float32)
    checkpointed = checkpointed_layers(engine.model)
    assert len(checkpointed) == 2  # the engine checkpoints both decoder layers; an RL step still does afterwards
    recomputed_by: list[int] = []  # a checkpointed layer's forward goes through its checkpointing function
    for index, layer in enumerate(checkpointed):
        checkpoint = layer._gradient_checkpointing_func
        layer._gradient_checkpointing_func = (lambda *args, index=index, checkpoint=checkpoint, **kw:
                                              recomputed_by.append(index) or checkpoint(*args, **kw))  # fmt: skip
    rows = training.sft_rows(engine.tokenizer, _demos(2))
    kept = training.kept_bytes(engine.model, "packed")  # measured before: its passes recompute
    per_layer = kept[0] * 2_000 + kept[1]  # a layer of a pass over more than the rows' 1,554 positions
    metrics = []
    for budget, recomputing in ((0, {0, 1}), (int(per_layer), {0}), (int(2 * per_layer), set())):
        engine.kept = KeptActivations(budget, lambda model, kind: kept)
        recomputed_by.clear()
        metrics.append(training.sft_step(engine.model, engine.optimizer, rows, learning_rate=0.0, max_grad_norm=1e9,
                                         kept=engine.kept))  # fmt: skip
        assert set(recomputed_by) == recomputing  # the last layers keep theirs first
    assert metrics[0]["grad_norm"] > 0  # learning rate 0: the same weights every time
    assert metrics[1] == pytest.approx(metrics[0], rel=1e-5) and metrics[2] == pytest.approx(metrics[0], rel=1e-5)
    assert all(module.gradient_checkpointing for module in checkpointed)
