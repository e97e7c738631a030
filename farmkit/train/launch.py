"""What the policy-gradient methods (PPO, Quark) need from accelerate beyond prepare(): the setup that
really runs (recorded in meta.json), DeepSpeed's batch settings filled in from the method's own, and
the trained module whole where ZeRO-3 splits it (to generate with it and to save it)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# how a run was really launched is recorded in meta.json by farmkit.lm.modelio; named here too
from farmkit.lm.modelio import launch_record as launch_record

log = logging.getLogger("farmkit")


def deepspeed_launched() -> bool:
    """`accelerate launch --use_deepspeed` (or a DeepSpeed accelerate config) started this process."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def use_cpu(on_gpu: bool) -> bool:
    """Whether to tell accelerate (or a Trainer's `use_cpu`) to run on the CPU. Without a GPU,
    accelerate joins torchrun's processes only when told `cpu` (else each runs alone, samples
    everything and writes the output); but `cpu` also drops DeepSpeed without a word, so a DeepSpeed
    launch keeps it off (DeepSpeed then runs on the CPU by itself)."""
    return not on_gpu and not deepspeed_launched()


def join_deepspeed_processes() -> bool:
    """Make accelerate count the processes of a DeepSpeed launch on CPUs; call it before any
    Accelerator or Trainer is made. Returns whether it had to (a Trainer must then be told to keep
    that state: `trainer_state_config`).

    accelerate (1.15) learns the number of processes and this process's index from the
    communication backend it picks itself, and it picks one only for an accelerator (a GPU...):
    on a machine without one it lets DeepSpeed join the launcher's processes (DeepSpeed's CPU
    accelerator: gloo, or ccl where oneCCL is installed) but then records one process, of index 0,
    on every process. Each process takes itself for the main and only one, and the batch size
    computed for one process fails DeepSpeed's check, which counts them all ("train_batch_size is
    not equal to micro_batch_per_gpu * gradient_acc_step * world_size 4 != 4 * 1 * 2"). Naming
    DeepSpeed's backend to accelerate's process state makes it read the count from the process
    group."""
    if not deepspeed_launched() or int(os.environ.get("LOCAL_RANK", "-1")) == -1:
        return False
    import torch

    if torch.cuda.is_available():
        return False
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        return False
    from accelerate.state import AcceleratorState, PartialState

    # a fresh state (a previous Trainer's, e.g. expert iteration's last round, held its own plugin);
    # the process group itself, once joined, stays
    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState(backend=accelerator.communication_backend_name())
    return True


def trainer_state_config() -> dict[str, Any]:
    """The TrainingArguments keywords of a Trainer that must join the processes as
    `join_deepspeed_processes` does (it calls it): a Trainer resets accelerate's state and makes its
    own, with the process count wrong on CPUs, unless told to use the state made before it."""
    if not join_deepspeed_processes():
        return {}
    return {"accelerator_config": {"use_configured_state": True}}


def make_accelerator(cpu: bool = False, **kwargs: Any) -> Any:
    """An Accelerator that joins the launcher's processes (see `use_cpu` and
    `join_deepspeed_processes`)."""
    import torch
    from accelerate import Accelerator

    if not cpu:
        join_deepspeed_processes()
    return Accelerator(cpu=cpu or use_cpu(torch.cuda.is_available()), **kwargs)


def check_device(device: str) -> str:
    """Refuse a --device other than auto that a launch would not honour, and one that is not there;
    put a single process on the GPU asked for (cuda:1). Call it before any Accelerator or Trainer
    is made; returns the device (auto resolved)."""
    from farmkit.core.io import FarmError
    from farmkit.lm.models import choose_device

    if device != "auto" and deepspeed_launched():
        # Accelerator(cpu=True) would drop DeepSpeed without a word; the run would not be what was launched
        raise FarmError(
            "--device: under DeepSpeed the engine places the model; leave --device auto"
        )
    if device not in ("auto", "cpu") and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise FarmError(
            "--device: under accelerate launch every process uses its own device; leave --device auto"
        )
    chosen = choose_device(device)
    if chosen.startswith("cuda:"):
        import torch

        torch.cuda.set_device(chosen)  # accelerate's and the Trainer's "cuda" is the current GPU
    return chosen


def device_accelerator(device: str, **kwargs: Any) -> Any:
    """make_accelerator on the --device asked for (check_device; cpu: the CPU even with a GPU)."""
    check_device(device)
    return make_accelerator(cpu=device == "cpu", **kwargs)


def zero_stage(accelerator: Any) -> int:
    """DeepSpeed's ZeRO stage, 0 when DeepSpeed is not in use."""
    plugin = accelerator.state.deepspeed_plugin
    return int(plugin.zero_stage) if plugin is not None else 0


def refuse_lora_under_zero3(accelerator: Any, lora: bool) -> None:
    """Merging adapters whose base weights ZeRO-3 has split is not supported: say so up front."""
    from farmkit.core.io import FarmError

    if lora and zero_stage(accelerator) == 3:
        raise FarmError(
            "--lora under ZeRO-3 is not supported (merging split adapters is untested): "
            "use ZeRO-2, DDP or one process"
        )


def configure_deepspeed(
    accelerator: Any, micro_batch_size: int, accumulation_steps: int, max_grad_norm: float
) -> None:
    """Set DeepSpeed's batch and clipping settings to the method's own (there is no dataloader for
    accelerate to read them from): the method's options win over the DeepSpeed config, with a warning."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return
    config = plugin.deepspeed_config
    wanted = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": accumulation_steps,
        "train_batch_size": micro_batch_size * accumulation_steps * accelerator.num_processes,
        "gradient_clipping": max_grad_norm,
    }
    for key, value in wanted.items():
        given = config.get(key, "auto")
        if given != "auto" and given is not None and float(given) != float(value):
            log.warning(
                "DeepSpeed config: %s = %s replaced by %s (from the method's batch options)",
                key,
                given,
                value,
            )
        config[key] = value


@contextmanager
def no_zero3_init(accelerator: Any) -> Iterator[None]:
    """Load models whole: under a ZeRO-3 config with zero3_init, from_pretrained would split even the
    frozen models (reference, reward model), which no engine then gathers for their forward passes."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        yield
        return
    with plugin.zero3_init_context_manager(enable=False), whole_models():
        yield


@contextmanager
def whole_models() -> Iterator[None]:
    """from_pretrained loads whole weights inside this block, even after a Trainer set up ZeRO-3 in
    this process (transformers keeps a weak reference to that config, which outlives the Trainer:
    a later load for sampling would come out split, with no engine to gather it)."""
    import transformers.integrations.deepspeed as hf_deepspeed

    saved = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = saved


@contextmanager
def for_generation(accelerator: Any, model: Any) -> Iterator[Any]:
    """The unwrapped module to sample from; under ZeRO-3 its weights gathered whole on every process
    (each process generates a different number of tokens, so per-layer gathering would deadlock)."""
    if zero_stage(accelerator) != 3:
        yield accelerator.unwrap_model(model)
        return
    import deepspeed
    from trl.models.utils import add_hooks, remove_hooks

    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        remove_hooks(
            model
        )  # the engine's per-layer fetch and release, needless with the weights whole
        try:
            yield accelerator.unwrap_model(model)
        finally:
            add_hooks(model)


@contextmanager
def full_weights(accelerator: Any, model: Any) -> Iterator[Any]:
    """The unwrapped module with every parameter whole, to save (ZeRO-3 keeps a shard per process;
    every process must enter, the gathering is collective)."""
    unwrapped = accelerator.unwrap_model(model)
    if zero_stage(accelerator) != 3:
        yield unwrapped
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(unwrapped.parameters()), modifier_rank=None):
        yield unwrapped


def offload_frozen(network: Any, execution_device: str) -> Any:
    """Keep a frozen model's weights in CPU memory: each layer's weights are copied to
    `execution_device` only while that layer runs, then dropped (accelerate's cpu_offload), so the
    model takes about one layer of GPU memory instead of all of it, at the price of the copies."""
    import torch
    from accelerate import cpu_offload

    network.to("cpu")
    return cpu_offload(network, execution_device=torch.device(execution_device))
