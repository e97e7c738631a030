"""One minibatch's update under one process and under the launcher's processes, for every
registered policy loss at once (each loss trains its own parameters, so one backward serves
them all): run under torchrun (`--nproc_per_node 2`), or under `accelerate launch` with a
DeepSpeed config. Rank 0 also computes the single-process update of the whole minibatch (no
launcher) and writes, per loss, the largest absolute difference between the two updated weights
(one SGD step at learning rate 1: the difference of the gradients), and the largest change of a
weight, to the JSON file named by its argument. in_threads() stands two processes in for the
launcher's in one (threads, their counts reduced between them, the gradients averaged): the
default lane's cheap check.

The minibatch: 8 responses of uneven lengths; the processes take consecutive halves, of 16 and
19 tokens under two processes, each in micro-batches of 2 (gradient accumulation). The group
losses add the KL term (--kl-in loss); token-mean is farm-ppo's, with its value loss. The
trainer's own pieces make the update: the method's loss, farmkit.train.onpolicy's
minibatch_counts, and its scaling of the backward."""

from __future__ import annotations

import contextlib
import json
import sys
from types import SimpleNamespace

import torch

from farmkit.methods.group import GroupMethod, GRPOConfig
from farmkit.methods.ppo import PPOConfig, PPOMethod
from farmkit.train import estimators as E
from farmkit.train import onpolicy
from farmkit.train.onpolicy import MicroBatch, Prepared

ROWS, WIDTH, MICRO = 8, 6, 2
LENGTHS = [6, 2, 5, 3, 6, 4, 6, 3]  # 16 tokens in the first half, 19 in the second


def data() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    mask = (torch.arange(WIDTH)[None, :] < torch.tensor(LENGTHS)[:, None]).float()
    base = -1 - torch.rand(ROWS, WIDTH, generator=generator) * 2
    return dict(
        mask=mask,
        base=base,
        x=draw(ROWS, WIDTH),
        old=base + 0.3 * draw(ROWS, WIDTH),
        ref=base + 0.3 * draw(ROWS, WIDTH),
        advantages=draw(ROWS),
        token_advantages=draw(ROWS, WIDTH) * mask,
        y=draw(ROWS, WIDTH),
        returns=draw(ROWS, WIDTH) * mask,
        old_values=0.1 * draw(ROWS, WIDTH) * mask,
    )


def methods() -> dict[str, tuple[object, bool]]:
    """Each registered loss with the method that uses it, and whether it has a value model."""
    out = {}
    for name, entry in E.POLICY_LOSSES.items():
        if entry.kind == E.TOKEN:
            out[name] = (PPOMethod(PPOConfig(policy_loss=name)), True)
        else:
            config = GRPOConfig(policy_loss=name, kl_in="loss", kl_coef=0.1, kl_estimator="k3")
            out[name] = (GroupMethod(config), False)
    return out


class Model(torch.nn.Module):
    """Per loss, a weight per position: log pi = base + w * x; values = v * y where a value model
    trains (every parameter has a gradient, or DDP would not reduce them)."""

    def __init__(self) -> None:
        super().__init__()
        zeros = lambda: torch.nn.Parameter(torch.zeros(WIDTH))  # noqa: E731
        self.w = torch.nn.ParameterDict({n: zeros() for n in E.POLICY_LOSSES})
        self.v = torch.nn.ParameterDict(
            {n: zeros() for n, entry in E.POLICY_LOSSES.items() if entry.kind == E.TOKEN}
        )

    def forward(self, base: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> dict:
        return {n: (base + self.w[n] * x, self.v[n] * y if n in self.v else None) for n in self.w}


def update(model, optimizer, rows, reduce_sum, backward, accumulate) -> None:
    """One minibatch of `rows` (this process's), in micro-batches, as OnPolicyTrainer.update."""
    d, chosen = data(), methods()
    local = {name: value[rows] for name, value in d.items()}
    mask = local["mask"]
    responses, tokens = onpolicy.minibatch_counts(mask, reduce_sum)
    accumulation = -(-len(rows) // MICRO)
    for start in range(0, len(rows), MICRO):
        index = torch.arange(start, min(start + MICRO, len(rows)))
        with accumulate():
            outputs = model(local["base"][index], local["x"][index], local["y"][index])
            total = 0.0
            for name, (method, has_values) in chosen.items():
                logprobs, values = outputs[name]
                prepared = Prepared(
                    local["token_advantages"] if has_values else local["advantages"],
                    None,
                    returns=local["returns"],
                    old_values=local["old_values"],
                )
                micro = MicroBatch(
                    logprobs,
                    values,
                    index,
                    mask[index],
                    local["old"][index],
                    local["ref"][index],
                    responses,
                    tokens,
                )
                loss, _ = method.loss(micro, prepared)
                total = total + loss
            # as the trainer: the loss is the minibatch's already, accelerate divides by the
            # micro-batches
            backward(total * accumulation)
            optimizer.step()
            optimizer.zero_grad()


def single_process() -> dict[str, torch.Tensor]:
    """The weights after the whole minibatch's update in one process, no launcher: the
    micro-batches' gradients added up, then one step."""
    torch.manual_seed(0)
    model = Model()
    accumulation = -(-ROWS // MICRO)
    held = SimpleNamespace(step=lambda: None, zero_grad=lambda: None)
    update(
        model,
        held,
        torch.arange(ROWS),
        lambda t: t,
        lambda loss: (loss / accumulation).backward(),
        contextlib.nullcontext,
    )
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def differences(states: dict[str, torch.Tensor]) -> dict[str, dict[str, float]]:
    """Per loss, the largest absolute difference of `states` from the single-process update's
    weights, and the largest change of a weight in that update."""
    expected = single_process()
    out: dict[str, dict[str, float]] = {"max_abs_diff": {}, "moved": {}}
    for name in E.POLICY_LOSSES:
        keys = [k for k in expected if k.endswith(f".{name}")]
        out["max_abs_diff"][name] = max(float((states[k] - expected[k]).abs().max()) for k in keys)
        out["moved"][name] = max(float(expected[k].abs().max()) for k in keys)
    return out


def in_threads(world: int = 2) -> dict[str, dict[str, float]]:
    """The update of `world` stand-in processes, each a thread with its own copy of the model and
    its share of the minibatch, reduce_sum adding their tensors, the gradients then averaged (as
    DDP does): differences() of the weights after one SGD step. No launcher: cheap."""
    import threading

    barrier, slots = threading.Barrier(world), [None] * world
    models = [Model() for _ in range(world)]
    errors = []

    def reduce_sum(rank: int, tensor: torch.Tensor) -> torch.Tensor:
        slots[rank] = tensor
        barrier.wait()
        total = sum(slots)
        barrier.wait()
        return total

    def run(rank: int) -> None:
        try:
            update(
                models[rank],
                SimpleNamespace(step=lambda: None, zero_grad=lambda: None),
                torch.arange(ROWS).reshape(world, -1)[rank],
                lambda t: reduce_sum(rank, t),
                lambda loss: (loss / (ROWS // world // MICRO)).backward(),
                contextlib.nullcontext,
            )
        except BaseException as error:  # raised in the test's thread below
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    for parameters in zip(*(m.parameters() for m in models), strict=True):
        average = sum(p.grad for p in parameters) / world
        for p in parameters:
            p.grad = average.clone()
    for model in models:
        torch.optim.SGD(model.parameters(), lr=1.0).step()
    return differences({k: v.detach() for k, v in models[0].state_dict().items()})


def main(out: str) -> None:
    from farmkit.train import launch

    # as the trainer's: it joins the launcher's processes (DDP over gloo, or DeepSpeed)
    accelerator = launch.make_accelerator()
    accumulation = -(-ROWS // accelerator.num_processes // MICRO)
    accelerator.gradient_accumulation_steps = accumulation
    launch.configure_deepspeed(accelerator, MICRO, accumulation, 1e9)  # no clipping
    world, rank = accelerator.num_processes, accelerator.process_index
    torch.manual_seed(0)
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    rows = torch.arange(ROWS).reshape(world, -1)[rank]
    update(
        model,
        optimizer,
        rows,
        lambda t: accelerator.reduce(t, reduction="sum"),
        accelerator.backward,
        lambda: accelerator.accumulate(model),
    )
    state = {k: v.detach().float().cpu() for k, v in accelerator.get_state_dict(model).items()}
    if accelerator.is_main_process:
        with open(out, "w") as f:
            json.dump({"processes": world, **differences(state)}, f)
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main(sys.argv[1])
