"""ZeRO-3's optimizer step and the end of its backward, where DeepSpeed does host work per weight while the
GPU waits (`train.sharding.zero3_lean_step`, `train.sharding.zero3_fused_epilogue`; planned with the rest
of `train.sharding` in parallel/sharding.py). Both replace parts of DeepSpeed's ZeRO-3 optimizer on its
instance, after `deepspeed.initialize`; the classes stay as DeepSpeed made them.

- `zero3_lean_step` (ZeRO-3). At each optimizer step DeepSpeed releases every weight, those it keeps whole
  (`ds_persist`) included (`partition_all_parameters`), and after the update gathers each of the kept ones
  again by an all-gather of its own (`DeepSpeedZeroOptimizer_Stage3._post_step`, through
  `_allgather_params_coalesced`, which for all its name launches one collective per weight). With LoRA
  nearly all of them are frozen: they never change, so releasing and gathering them again is host work and
  traffic alone (Qwen2-7B under the shipped zero3.json: 253 frozen weights, 1.6 GB gathered per step, and
  224 adapter weights; every step 477 collectives launched one by one while the GPU waits for the step).
  `lean_step` keeps all of them gathered through the step, and skips DeepSpeed's release walk over every
  weight of the model when the backward's hooks have left nothing gathered. After the update it brings the
  trainable ones up to date in place: their updated partitions laid end to end (one copy), one all-gather,
  and one multi-tensor copy of each rank's slice into each weight (`_TrainableRefresh`), where DeepSpeed would
  allocate, gather and concatenate each weight anew. The update, and the values each weight holds when the
  next forward reads it, are DeepSpeed's; a trainable weight released meanwhile (its checkpoint save and
  load, `GatheredParameters` on leaving) is gathered again by DeepSpeed's own all-gather. Where this
  DeepSpeed's optimizer lacks one of the parts it changes, it changes nothing and the start-up line says
  so. `auto` is on: on 4×H200 its first form (the trainable weights released and gathered again by one
  all-gather) gave 76.3 % and 76.3 % of one GPU's tokens/s per GPU against 71.8 % and 71.0 % with
  DeepSpeed's step, interleaved in one call, and 0.9 GiB less memory per GPU; on 2 GPUs 79.5 %, and the
  form as shipped 83.4 % and 83.4 % on 2×H200 against 73.9 % and 76.8 % with DeepSpeed's step
  (`benchmarks/results/2026-11-28-h200x4-finetune-zero3-lean/`); as shipped on 4×H200, 80.4 %, 80.7 % and
  81.9 % in two calls (`benchmarks/results/2026-11-28-h200x4-finetune-scaling/`).
  A CPU stand-in with Qwen2-7B's module structure at hidden size 112 (two gloo ranks) went from about
  1,150 to 560–710 ms per step, DDP's 540.

- `zero3_fused_epilogue` (ZeRO-3). The adapter's gradients, which DeepSpeed's hooks copy into one bucket
  during the backward, are reduced at its end (`__reduce_and_partition_ipg_grads`): DeepSpeed cuts each
  weight's gradient into one slice per rank, concatenates them rank by rank, reduce-scatters, and then,
  weight by weight, converts this rank's slice to fp32 and copies it into the optimizer's gradient
  partition: for Qwen2-7B's 224 adapter weights about a thousand operations, launched one by one by
  Python at the one point of the step where the GPU has nothing else queued (the longest idle gaps of a
  profiled ZeRO-3 step on 2×H200, 12 and 16 ms:
  `benchmarks/results/2026-11-28-h200x2-finetune-zero3-profile/`).
  `fused_gradient_epilogue` lays the views out once and then runs the same arithmetic as one multi-tensor
  copy into the rank-by-rank order, one reduce-scatter and one multi-tensor copy (or add, when the step
  accumulates micro-batches) into the partitions (`_BucketEpilogue`). Every case DeepSpeed's reduce-scatter
  path with contiguous gradients does not cover is left to DeepSpeed. `auto` is off: on 2×H200 it took
  rank 0's end-of-backward gaps from 16 and 12 ms to 5 and 4 ms in a profiled step, but gave 83.6 % and
  83.9 % of one GPU's tokens/s per GPU against 84.6 % and 82.6 % with DeepSpeed's epilogue, interleaved in
  one call: no difference within ZeRO-3's spread; on one H200 at world size 1 (no peer to wait for) 81.6 %
  and 84.2 % against 82.0 % and 81.9 % (`benchmarks/results/2026-11-28-h200x2-finetune-zero3-profile/`);
  on 4×H200 81.5 % and 81.2 % against 80.7 % and 81.9 %, interleaved
  (`benchmarks/results/2026-11-28-h200x4-finetune-scaling/`).
"""

from __future__ import annotations

from typing import Any

import torch


def lean_step(engine: Any) -> tuple[int, int] | None:
    """After `deepspeed.initialize` with ZeRO-3: the optimizer step keeps every weight ZeRO-3 keeps whole
    gathered, and brings the trainable ones up to date by one all-gather (module docstring). Returns how
    many frozen and trainable ones, or None when this DeepSpeed's optimizer lacks a part this changes (then
    nothing is)."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    optimizer = engine.optimizer
    offload = getattr(optimizer, "parameter_offload", None)
    persistent = getattr(optimizer, "persistent_parameters", None)
    post_step = getattr(optimizer, "_post_step", None)
    release_all = getattr(offload, "partition_all_parameters", None)
    if persistent is None or post_step is None or release_all is None:
        return None
    frozen = [p for p in persistent if not p.requires_grad]
    trainable = [p for p in persistent if p.requires_grad]
    gather_released(frozen)  # once, here, on every rank alike
    optimizer.persistent_parameters = trainable  # what the checkpoint's save and load release and gather
    refresh = _TrainableRefresh(trainable)
    # gathered through the step: the frozen ones, and the trainable ones where they are refreshed in place
    # (else DeepSpeed releases them and the refresh gathers them again)
    kept = frozen + (trainable if refresh.in_place else [])
    kept_whole = {id(p) for p in kept}
    every = list(engine.module.parameters())

    def nothing_to_release() -> bool:
        return all(
            not p.ds_active_sub_modules
            and (id(p) in kept_whole or p.ds_status == ZeroParamStatus.NOT_AVAILABLE)
            for p in every
        )

    def partition_all_parameters() -> None:
        # DeepSpeed walks every weight of the model twice to release what is gathered; after a backward
        # whose hooks released each partitioned weight there is nothing (none gathered, in flight or in
        # use by a module), and the walk is skipped
        if nothing_to_release():
            return
        # those kept through the step look released meanwhile, so they keep their gathered data
        hidden = [p for p in kept if p.ds_status == ZeroParamStatus.AVAILABLE]
        for param in hidden:
            param.ds_status = ZeroParamStatus.NOT_AVAILABLE
        try:
            release_all()
        finally:
            for param in hidden:
                param.ds_status = ZeroParamStatus.AVAILABLE

    def refresh_then_post_step(timer_names: Any) -> None:
        refresh()  # the partitions the step updated, into the gathered weights
        gathered = optimizer.persistent_parameters
        optimizer.persistent_parameters = []  # up to date: DeepSpeed's own step has none left to gather
        try:
            post_step(timer_names)
        finally:
            optimizer.persistent_parameters = gathered

    offload.partition_all_parameters = partition_all_parameters  # instance attributes: the classes stay
    optimizer._post_step = refresh_then_post_step
    return len(frozen), len(trainable)


def gather_released(params: list[Any]) -> None:
    """Gather those of `params` (weights ZeRO-3 keeps whole) that are released, by one all-gather. Every
    rank holds the same ones released: DeepSpeed releases and gathers collectively."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    released = [p for p in params if p.ds_status == ZeroParamStatus.NOT_AVAILABLE]
    if released:
        released[0].all_gather_coalesced(released).wait()


class _TrainableRefresh:
    """The trainable weights ZeRO-3 keeps whole, brought up to date in place after the optimizer updated
    their partitions: the partitions laid end to end (one copy), one all-gather, one multi-tensor copy of
    each rank's slice into each weight's gathered data. A weight released meanwhile (DeepSpeed's checkpoint
    save and load, `GatheredParameters` on leaving) is gathered again by DeepSpeed's own all-gather, and the
    slices are laid out again for its new data. Weights with a secondary partition (hpZ) or another process
    group than the first's are not kept through the step (`in_place` false): DeepSpeed releases them in its
    step and they are gathered again by its all-gather."""

    def __init__(self, params: list[Any]) -> None:
        self.params = sorted(params, key=lambda p: p.ds_id)  # one order on every rank
        self.plan: tuple[Any, ...] | None = None
        groups = {id(p.ds_process_group) for p in self.params}
        self.in_place = len(groups) == 1 and all(p.ds_secondary_tensor is None for p in self.params)

    def __call__(self) -> None:
        if not self.params:
            return
        gather_released(self.params)  # any released meanwhile, from the partitions the step updated
        if not self.in_place:  # DeepSpeed released them all in its step: gathered above
            return
        # the others in place; one gathered above has new data, so the slices are laid out again
        if self.plan is None or self.plan[0] != [p.data.data_ptr() for p in self.params]:
            self.plan = self._lay_out()
        _, send, received, group, into, slices = self.plan
        torch.cat([p.ds_tensor.view(-1) for p in self.params], out=send)
        torch.distributed.all_gather_into_tensor(received, send, group=group)
        torch._foreach_copy_(into, slices)

    def _lay_out(self) -> tuple[Any, ...]:
        first = self.params[0]
        group = first.ds_process_group
        world = torch.distributed.get_world_size(group)
        sizes = [p.ds_tensor.ds_numel for p in self.params]  # each rank's partition of each weight
        total = sum(sizes)
        send = torch.empty(total, dtype=first.ds_tensor.dtype, device=first.data.device)
        received = torch.empty(world * total, dtype=send.dtype, device=send.device)
        by_rank = received.view(world, total)
        into, slices = [], []
        offset = 0
        for param, size in zip(self.params, sizes, strict=True):
            flat = param.data.view(-1)
            for rank in range(world):  # rank r holds elements [r·size, (r+1)·size) of the padded weight
                start = rank * size
                count = min(size, param.ds_numel - start)
                if count <= 0:
                    break
                into.append(flat.narrow(0, start, count))
                slices.append(by_rank[rank].narrow(0, offset, count))
            offset += size
        return [p.data.data_ptr() for p in self.params], send, received, group, into, slices


# DeepSpeed's ZeRO-3 optimizer method that reduces the gradient bucket and copies each weight's partition
# into the fp32 gradient partitions (`__reduce_and_partition_ipg_grads`: private, so name-mangled)
REDUCE_BUCKET = "_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads"
GRAD_PARTITIONS = "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition"


def fused_gradient_epilogue(engine: Any) -> bool:
    """After `deepspeed.initialize` with ZeRO-3: the reduction of the gradient bucket at the end of each
    backward by a fixed number of operations instead of several per weight (module docstring). Returns
    False when this DeepSpeed's optimizer lacks a part this replaces (then nothing is)."""
    optimizer = engine.optimizer
    needed = (REDUCE_BUCKET, GRAD_PARTITIONS, "ipg_buckets", "micro_step_id", "_offload_boundary_param_ids")
    if not all(hasattr(optimizer, name) for name in needed):
        return False
    setattr(optimizer, REDUCE_BUCKET, _BucketEpilogue(optimizer, getattr(optimizer, REDUCE_BUCKET)))
    return True


class _BucketEpilogue:
    """DeepSpeed's reduction of one gradient bucket, as one multi-tensor copy, one reduce-scatter and one
    multi-tensor copy (or add, when accumulating) into the fp32 gradient partitions, with every view laid
    out once. The arithmetic is DeepSpeed's reduce-scatter path (`reduce_scatter_coalesced`, then
    `partition_grads`): each weight's gradient cut into one chunk per rank, the chunks laid out rank by rank,
    divided by the world size in the gradients' dtype, summed by the reduce-scatter, this rank's chunks
    converted to the partitions' dtype and copied (or added) into them. Any case that path does not cover
    (offloaded optimizer, a size that needs padding, several process groups, gradient scaling factors, the
    all-reduce or all-to-all paths, gradients outside the bucket's buffer) is left to DeepSpeed's own."""

    def __init__(self, optimizer: Any, original: Any) -> None:
        self.optimizer = optimizer
        self.original = original
        self.plan: tuple[list[Any], tuple[Any, ...] | None] | None = None  # (key, views)

    def __call__(self, communication_data_type: torch.dtype) -> None:
        optimizer = self.optimizer
        bucket = optimizer.ipg_buckets[communication_data_type]
        params = bucket.params
        if not params:
            return
        key = self._key(params)
        if self.plan is None or self.plan[0] != key:
            self.plan = key, self._lay_out(bucket, communication_data_type)
        if self.plan[1] is None:  # a case DeepSpeed's own path handles
            self.original(communication_data_type)
            return
        _, (group, world, send, into_send, chunks, received, converted, into, parts) = self.plan
        from deepspeed.accelerator import get_accelerator

        with get_accelerator().stream(optimizer.reduce_and_partition_stream):
            torch._foreach_copy_(into_send, chunks)
            send.div_(world)
            torch.distributed.reduce_scatter_tensor(received, send, group=group)
            if converted is not received:
                converted.copy_(received)
            if optimizer.micro_step_id == 0:
                torch._foreach_copy_(into, parts)
            else:
                torch._foreach_add_(into, parts)
        optimizer._offload_boundary_param_ids.update(p.ds_id for p in params)
        # the gradients are views of the bucket's buffer, which DeepSpeed keeps for the whole run: no
        # stream use to record for a later free, as DeepSpeed does for gradients of their own
        for param in params:
            param.grad = None
        params.clear()
        bucket.elements = 0
        bucket.process_group = None

    def _key(self, params: list[Any]) -> list[Any]:
        """What the views are laid out for: the bucket's weights and where their gradients lie, and the
        partitions' storage (DeepSpeed's offload_states and reload_states make it anew)."""
        partitions = getattr(self.optimizer, GRAD_PARTITIONS)
        flat = getattr(self.optimizer, "grad_partitions_flat_buffer", None)
        where = (id(partitions), None if flat is None else flat.data_ptr())
        return [where, *((p.ds_id, p.grad.data_ptr()) for p in params)]

    def _lay_out(self, bucket: Any, communication_data_type: torch.dtype) -> tuple[Any, ...] | None:
        """The views for this bucket's weights, or None where DeepSpeed's own path is the one to run."""
        optimizer = self.optimizer
        params = list(bucket.params)
        group = bucket.process_group
        world = torch.distributed.get_world_size(group)
        buffer = bucket.buffer
        begin = buffer.data_ptr()
        end = begin + buffer.numel() * buffer.element_size()
        grads = [p.grad for p in params]
        covered = (
            optimizer.reduce_scatter
            and optimizer.contiguous_gradients
            and not optimizer.offload_optimizer
            and not getattr(optimizer, "zenflow", False)
            and getattr(optimizer, "all2all_process_group", None) is None
            and optimizer.gradient_predivide_factor == 1.0
            and communication_data_type == optimizer.dtype
            and optimizer._gradient_averaging_world_size(params, world) == world
            and all(optimizer._get_param_partition_group(p) is group for p in params)
            and all(
                g.dtype == communication_data_type
                and g.is_contiguous()
                and begin <= g.data_ptr() < end
                and g.numel() == p.ds_numel
                and g.numel() % world == 0
                and p.partition_numel() == g.numel() // world
                for p, g in zip(params, grads, strict=True)
            )
        )
        if not covered:
            return None
        sizes = [g.numel() // world for g in grads]  # each rank's chunk of each weight
        total = sum(sizes)
        send = torch.empty(world * total, dtype=communication_data_type, device=buffer.device)
        by_rank = send.view(world, total)
        received = torch.empty(total, dtype=communication_data_type, device=buffer.device)
        partitions = getattr(optimizer, GRAD_PARTITIONS)
        into = [partitions[p.ds_id].narrow(0, 0, size) for p, size in zip(params, sizes, strict=True)]
        dtype = into[0].dtype
        if any(t.dtype != dtype for t in into):
            return None
        converted = (
            received if dtype == received.dtype else torch.empty(total, dtype=dtype, device=send.device)
        )
        into_send, chunks, parts = [], [], []
        offset = 0
        for grad, size in zip(grads, sizes, strict=True):
            into_send.append(by_rank.narrow(1, offset, size))  # rank r's chunk at row r
            chunks.append(grad.view(world, size))
            parts.append(converted.narrow(0, offset, size))
            offset += size
        return group, world, send, into_send, chunks, received, converted, into, parts
