"""The last decoder layer's MLP on the labelled rows alone (`train.step.last_mlp_rows: labelled`), and its
part (LastMlpRowsPart)."""

from __future__ import annotations

from typing import Any

import torch

from gpuval.finetune.parts import Decision, Part, StepContext


class LastMlpRows:
    """The last decoder layer's MLP on the labelled rows alone (`train.step.last_mlp_rows: labelled`).

    The loss reads the final hidden states at the labelled rows only (`label_rows`, `LossHead`), and after
    the last layer's attention nothing mixes positions: its MLP, the residual add and the final norm act on
    each row alone. So that MLP's products (forward and input gradient: seven eighths of the layer's base
    products for Qwen2-7B) are needed on those rows only. While `rows` is set, the MLP runs on them and
    returns zeros elsewhere; the final hidden states of the other rows are then wrong and must not be read,
    so `rows` is set around one micro-batch's forward and backward (backward too: activation checkpointing
    runs the forward again) and is None otherwise (evaluation, generation). The module tree is untouched:
    only the MLP instance's `forward` is replaced, as fused_qkv does, so weights and adapters save as before.
    """

    def __init__(self, mlp: torch.nn.Module) -> None:
        self.rows: torch.Tensor | None = None
        self._forward = mlp.forward
        mlp.forward = self.forward

    @classmethod
    def attach(cls, layers: list[torch.nn.Module]) -> LastMlpRows | None:
        """On the last of `layers` when its MLP is a dense gated one (gate, up and down projections: each
        position alone, unlike a mixture of experts with a capacity); else None (the step runs as it was)."""
        mlp = getattr(layers[-1], "mlp", None) if layers else None
        dense = mlp is not None and all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj"))
        return cls(mlp) if dense and not hasattr(mlp, "experts") else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = self.rows
        if rows is None:
            return self._forward(x)
        flat = x.reshape(-1, x.shape[-1])
        picked = self._forward(flat.index_select(0, rows))
        return torch.zeros_like(flat).index_copy(0, rows, picked.to(flat.dtype)).view_as(x)

    def use(self, rows: torch.Tensor | None) -> None:
        """`rows` (from `label_rows`, on the device) for the coming forward and backward; None for all.
        The row count changes every micro-batch: marked dynamic so a compiled layer does not recompile."""
        if rows is not None and rows.numel() < 2:  # 0 or 1 rows: shapes compile specialises; run them all
            rows = None
        if rows is not None:
            torch._dynamo.maybe_mark_dynamic(rows, 0)
        self.rows = rows


class LastMlpRowsPart(Part):
    """Labelled rows: the last decoder layer's MLP on the rows the loss reads (LastMlpRows).

    Applies with `train.step.last_mlp_rows: labelled` (the default, on every device and parallel mode) when
    the last layer's MLP is a dense gated one; otherwise the step runs as it was.
    Changes: the last MLP instance's `forward` (the module tree and state dict are untouched); the loop sets
    the rows around each micro-batch (`ctx.hooks["last_mlp_rows"]`).
    Reports `last_mlp_rows`: labelled, or all when off.
    Order: last of the parts (stage adapted), after split_products as measured: it wraps the MLP's
    `forward` as the parts before it left it (the linears inside keep whatever forward they were given);
    before compiling, which traces the wrapped forward."""

    name = "last_mlp_rows"
    stage = "adapted"
    reports = {"last_mlp_rows": "all"}

    def decide(self, ctx: StepContext) -> Decision:
        on = ctx.step.last_mlp_rows == "labelled"
        return Decision(on, on, "set" if on else "set: all")

    def apply(self, model: Any, ctx: StepContext, decision: Decision) -> dict[str, Any]:
        attached = LastMlpRows.attach(ctx.layers)
        if attached is None:
            return {"last_mlp_rows": "all"}
        ctx.hooks["last_mlp_rows"] = attached
        return {"last_mlp_rows": "labelled"}
