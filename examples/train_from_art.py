"""Train your own agent from ART: an unmodified ART script whose rollouts run here and whose training runs on
artsvc (`artsvc serve --local`, or a server and a token in ARTSVC_TOKEN). The task: add two numbers."""

import asyncio
import os
import random

import art

URL, TOKEN = os.environ.get("ARTSVC_API_URL", "http://127.0.0.1:8000"), os.environ.get("ARTSVC_TOKEN", "local")
BASE_MODEL = os.environ.get("BASE_MODEL", "SmolLM2-135M-Instruct")  # artsvc's default; an operator may allow others


async def rollout(model: art.TrainableModel, a: int, b: int) -> art.Trajectory:
    messages = [{"role": "user", "content": f"What is {a} + {b}? Reply with the number only."}]
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=messages, max_tokens=8, temperature=1.0)
    choice = completion.choices[0]  # carries logprobs: artsvc returns them, so it is trainable
    reply = (choice.message.content or "").strip()
    reward = (1.0 if reply == str(a + b) else 0.0) - 0.01 * len(reply)  # right, and the number only
    return art.Trajectory(messages_and_choices=[*messages, choice], reward=reward)


async def main(steps: int = 2) -> None:
    backend = art.ServerlessBackend(base_url=f"{URL}/v1", api_key=TOKEN)
    model = art.TrainableModel(name="adder", project="art-demo", base_model=BASE_MODEL)
    await model.register(backend)
    for _ in range(await model.get_step(), steps):
        problems = [(random.randint(1, 9), random.randint(1, 9)) for _ in range(4)]  # 16 rollouts: a token's cap
        groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(rollout(model, a, b) for _ in range(4)) for a, b in problems), pbar_desc="rollouts")
        result = await backend.train(model, groups, learning_rate=1e-4)
        rewards = [t.reward for g in groups for t in g.trajectories]
        loss = result.metrics.get("loss/train")
        print(f"step {result.step}: mean reward {sum(rewards) / len(rewards):.2f}, loss {loss}")
        await model.delete_checkpoints()  # keeps the newest (and ART's best by val/reward)


if __name__ == "__main__":
    asyncio.run(main())
