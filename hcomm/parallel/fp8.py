"""fp8 matmuls for the model's linear layers, with dynamic per-tensor scaling.

In the spirit of Transformer Engine and torchao's ``Float8Linear`` (dynamic
scaling): each matmul casts its operands to fp8 with one fp32 scale per
tensor taken from the tensor's current amax, and multiplies with
``torch._scaled_mm``:

- forward: input and weight in ``float8_e4m3fn`` (scale = amax / 448, the
  format's largest finite value; more mantissa, the range activations and
  weights need), output in bf16;
- backward: the output gradient in ``float8_e5m2`` (scale = amax / 57344;
  gradients need the range more than the mantissa), grad_input = g W and
  grad_weight = g^T x from ``_scaled_mm`` against the forward's e4m3 copies.

An all-zero tensor (amax = 0) gets scale 1, so it casts to zeros, not NaN.

Only the matmul is fp8: the Parameter stays fp32 (the master weight; it is
cast per matmul), its gradient lands in fp32, so gradient sync and the
optimizer are unchanged, and everything else runs under bf16 autocast as on
a bf16 rank.  The LM head and the embedding stay bf16, as TE and torchao
recommend: the logits feed the softmax and loss directly, where e4m3's 2^-4
relative error is the most visible.

``enable_fp8_linears(model)`` swaps each ``nn.Linear``'s forward in place
(the very same Parameter objects, so DDP, hooks and optimizers are
untouched); the swapped forward runs fp8 only inside ``fp8_active()``
(``Precision("fp8").autocast()`` enters it), else plain ``F.linear``, so one
model can be compared against fp32 (``hcomm calibrate``).
"""
from __future__ import annotations

import contextlib
import contextvars
import types
from typing import Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
E4M3_MAX, E5M2_MAX = torch.finfo(E4M3).max, torch.finfo(E5M2).max   # 448, 57344

_ACTIVE = contextvars.ContextVar("hcomm_fp8_active", default=False)
_SWAPPED = [0]   # linears swapped in this process: fp8 compute with none swapped would silently be bf16


@contextlib.contextmanager
def fp8_active():
    """Swapped linears compute in fp8 inside this context (and plain ``F.linear`` outside)."""
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def to_fp8(x: torch.Tensor, dtype: torch.dtype):
    """(codes, scale): ``x ~= codes * scale``, scale = amax / max finite of ``dtype`` (1 when amax = 0)."""
    fmax = E4M3_MAX if dtype == E4M3 else E5M2_MAX
    amax = x.detach().abs().max().float()
    scale = torch.where(amax > 0, amax / fmax, torch.ones_like(amax))
    # clamp: amax / (amax / fmax) may round a hair above fmax, which a non-saturating cast would make NaN
    return (x.float() / scale).clamp(-fmax, fmax).to(dtype), scale


def _mm(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    """(a * sa) @ (b * sb) in bf16.  ``_scaled_mm`` on CUDA wants ``a`` row-major, ``b`` column-major,
    dimensions multiple of 16 and refuses e5m2 x e5m2; CPU (torch 2.13) accepts every pairing and layout.
    A product torch refuses falls back to a bf16 matmul of the dequantised operands -- the same fp8
    rounding, only the multiply is not an fp8 kernel."""
    try:
        return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    except RuntimeError:
        # fp8 values are exact in bf16; the scales are applied to the product in fp32, unrounded
        return ((a.to(torch.bfloat16) @ b.to(torch.bfloat16)).float() * (sa * sb)).to(torch.bfloat16)


def _col_major(t: torch.Tensor) -> torch.Tensor:
    return t.t().contiguous().t()


class Fp8Matmul(torch.autograd.Function):
    """y = x W^T with x, W in e4m3 and the output gradient in e5m2 (module docstring)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        xq, sx = to_fp8(x2, E4M3)
        wq, sw = to_fp8(weight, E4M3)
        ctx.save_for_backward(xq, sx, wq, sw)
        ctx.x_dtype, ctx.lead = x.dtype, lead
        y = _mm(xq, sx, wq.t(), sw)            # (N, in) @ (in, out); wq.t() is column-major
        return y.reshape(*lead, weight.shape[0])

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        xq, sx, wq, sw = ctx.saved_tensors
        g2 = grad_out.reshape(-1, grad_out.shape[-1])
        gq, sg = to_fp8(g2, E5M2)
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:   # (N, out) @ (out, in)
            grad_x = _mm(gq, sg, _col_major(wq), sw).to(ctx.x_dtype).reshape(*ctx.lead, wq.shape[1])
        if ctx.needs_input_grad[1]:   # (out, N) @ (N, in), into the fp32 master weight's gradient
            grad_w = _mm(gq.t().contiguous(), sg, _col_major(xq), sx).float()
        return grad_x, grad_w


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear`` with the matmul in fp8 (bf16 out); the bias is added in bf16."""
    y = Fp8Matmul.apply(x, weight)
    return y if bias is None else y + bias.to(y.dtype)


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if _ACTIVE.get():
        return fp8_linear(x, self.weight, self.bias)
    return F.linear(x, self.weight, self.bias)


def enable_fp8_linears(model: nn.Module, keep: Iterable[nn.Module] = ()) -> int:
    """Swap the forward of every ``nn.Linear`` in ``model`` but the head (``model.head``, the last of
    ``model.layer_modules()``) and ``keep``; idempotent.  Returns how many linears are fp8-capable."""
    kept = {id(m) for m in keep}
    for name in ("head", "lm_head", "output"):
        if isinstance(getattr(model, name, None), nn.Module):
            kept.add(id(getattr(model, name)))
    if hasattr(model, "layer_modules"):
        kept.add(id(list(model.layer_modules())[-1]))
    count = 0
    for m in model.modules():
        if isinstance(m, nn.Linear) and id(m) not in kept:
            if not getattr(m, "_hcomm_fp8", False):
                m.forward = types.MethodType(_forward, m)
                m._hcomm_fp8 = True
                _SWAPPED[0] += 1
            count += 1
    return count


def any_swapped() -> bool:
    """Whether this process swapped any linear (``Precision("fp8")`` refuses to run without)."""
    return _SWAPPED[0] > 0
