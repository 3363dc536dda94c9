"""``hcomm calibrate``: how far each compute dtype strays from fp32, piece by piece.

Before mixing device kinds that compute in different dtypes, a user wants
to know how much each one's arithmetic moves the model: this runs every
piece of the model (embedding, blocks, norm, head + loss) on the same
inputs in fp32 and under autocast in each dtype the device kind has, and
reports per piece the relative error of its output (Frobenius norm of the
difference over the fp32 output's), the gradient of its input after a
backward of the same upstream gradient, and end to end the loss and the
logits.  Each piece is fed the fp32 reference's input, so a piece's error
is its own, not what the pieces before it accumulated; the end-to-end rows
show the accumulation.

Run it on each kind (``hcomm emulate run`` runs it on every rank with that
rank's device kind; on a real cluster, once per kind); ``--device`` names
the kind whose dtypes to test (default: this rank's).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

from hcomm.parallel.precision import COMPUTE_DTYPES, Precision


@dataclass
class PieceError:
    piece: str
    dtype: str
    output_rel: float     # ||out_d - out_32|| / ||out_32||
    input_grad_rel: float  # the same for the gradient each piece passes back


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    den = float(ref.float().norm())
    return float((a.float() - ref.float()).norm()) / den if den else float(a.float().norm())


def _piece_pass(piece, x, targets, upstream, is_head: bool, dtype: str):
    """(output, gradient of the input) of one piece in ``dtype`` on the fp32 input ``x``."""
    x = x if x.dtype == torch.long else x.detach().clone().requires_grad_()
    with Precision(dtype, device_type=x.device.type).autocast():
        out = piece(x)
        if is_head:
            out = F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), targets.reshape(-1))
    out.backward(torch.ones_like(out) if upstream is None else upstream.to(out.dtype))
    for p in piece.parameters():
        p.grad = None
    return out.detach().float(), (x.grad if x.requires_grad else None)


def calibrate(model: torch.nn.Module, dtypes: Sequence[str], *, micro_batch: int = 2, seq_len: int = 64,
              vocab_size: int = 512, seed: int = 0) -> Dict[str, object]:
    """Per-piece and end-to-end deviations of each dtype in ``dtypes`` from fp32 (see module docstring)."""
    if "fp8" in dtypes:   # swapped linears stay plain F.linear outside fp8's autocast: fp32 is unchanged
        Precision("fp8").prepare(model)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(vocab_size, (micro_batch, seq_len), generator=gen)
    targets = torch.randint(vocab_size, (micro_batch, seq_len), generator=gen)
    pieces = list(model.layer_modules())
    names = [n for n, _ in _named(model, pieces)]
    last = len(pieces) - 1
    inputs, upstream, reference, x = [], [], [], tokens
    for i, piece in enumerate(pieces):   # the fp32 reference: each piece's input, output, input gradient
        inputs.append(x)
        with torch.no_grad():
            out = piece(x)
        upstream.append(None if i == last else torch.randn(out.shape, generator=gen) * 1e-3)
        reference.append(_piece_pass(piece, x, targets, upstream[i], i == last, "fp32"))
        x = out
    rows: List[PieceError] = []
    for dtype in dtypes:
        for i, piece in enumerate(pieces):
            out, grad = _piece_pass(piece, inputs[i], targets, upstream[i], i == last, dtype)
            ref_out, ref_grad = reference[i]
            rows.append(PieceError(names[i], dtype, _rel(out, ref_out),
                                   _rel(grad, ref_grad) if grad is not None else 0.0))
    end_to_end = {}
    with torch.no_grad():
        ref_logits = model(tokens).float()
        ref_loss = float(F.cross_entropy(ref_logits.reshape(-1, ref_logits.shape[-1]), targets.reshape(-1)))
        for dtype in dtypes:
            with Precision(dtype, device_type=tokens.device.type).autocast():
                logits = model(tokens).float()
            loss = float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)))
            end_to_end[dtype] = {"logits_rel": _rel(logits, ref_logits), "loss": loss, "loss_fp32": ref_loss,
                                 "loss_rel": abs(loss - ref_loss) / abs(ref_loss)}
    return {"pieces": rows, "end_to_end": end_to_end}


def _named(model, pieces):
    names = {id(m): n for n, m in model.named_modules()}
    return [(names.get(id(p), type(p).__name__), p) for p in pieces]


def format_report(result: Dict[str, object], device: str) -> str:
    lines = [f"hcomm calibrate: {device}, relative error vs fp32 (||x_dtype - x_fp32|| / ||x_fp32||), "
             f"each piece on the fp32 input",
             f"  {'piece':<12}{'dtype':<7}{'output':>10}{'input grad':>12}"]
    for r in result["pieces"]:
        lines.append(f"  {r.piece:<12}{r.dtype:<7}{r.output_rel:>10.2e}{r.input_grad_rel:>12.2e}")
    lines.append("  end to end (errors accumulate through the pieces):")
    for dtype, e in result["end_to_end"].items():
        lines.append(f"  {dtype:<7} logits {e['logits_rel']:.2e}, loss {e['loss']:.5f} vs fp32 {e['loss_fp32']:.5f} "
                     f"({e['loss_rel']:.2e} relative)")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    from hcomm.models import build_model, get_config
    from hcomm.parallel.devices import device_kind, local_device_name

    p = argparse.ArgumentParser(prog="hcomm calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="named config or YAML file (default tiny)")
    p.add_argument("--device", default=None, help="device kind whose dtypes to test (default: this rank's)")
    p.add_argument("--dtypes", default=None, help="comma list (default: every low-precision dtype of the kind)")
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        kind = device_kind(args.device or local_device_name())
        dtypes = args.dtypes.split(",") if args.dtypes else [d for d in kind.dtypes if d != "fp32"]
        for d in dtypes:
            if d not in kind.dtypes:
                raise ValueError(f"--dtypes: {kind.name} cannot compute in {d} ({kind.notes})")
            if d not in COMPUTE_DTYPES:
                raise ValueError(f"--dtypes: {d!r} is not one of {', '.join(COMPUTE_DTYPES)}")
        config = get_config(args.model)
    except ValueError as e:
        print(f"hcomm calibrate: error: {e}", file=sys.stderr)
        return 2
    model = build_model(config, vocab_size=args.vocab, seed=args.seed)
    result = calibrate(model, dtypes, micro_batch=args.micro_batch, seq_len=args.seq_len, vocab_size=args.vocab,
                       seed=args.seed)
    print(format_report(result, kind.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
