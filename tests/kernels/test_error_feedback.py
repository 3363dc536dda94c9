"""Error feedback on a distributed least-squares problem.

Four simulated workers hold different data; each step every worker sends
its local gradient through fp8 compression and the average of the decoded
gradients drives gradient descent.  At the optimum the local gradients do
not vanish (only their sum does), so plain fp8 compression leaves an error
floor; error feedback, which re-sends what was not sent, reaches the
uncompressed loss.
"""
import pytest
import torch

from hcomm import compress


def _problem(seed=0, workers=4, rows=64, dim=48):
    g = torch.Generator().manual_seed(seed)
    w_true = torch.randn(dim, generator=g, dtype=torch.float64)
    parts = []
    for k in range(workers):
        a = torch.randn(rows, dim, generator=g, dtype=torch.float64) * (1 + k)  # heterogeneous workers
        b = a @ w_true + torch.randn(rows, generator=g, dtype=torch.float64) * 2.0
        parts.append((a, b))
    return parts


def _loss(parts, w):
    return sum(((a @ w - b) ** 2).sum().item() for a, b in parts) / 2


def _train(parts, wire, ef, steps=600):
    dim = parts[0][0].shape[1]
    lr = 1.0 / sum(torch.linalg.matrix_norm(a, 2).item() ** 2 for a, _ in parts)
    w = torch.zeros(dim, dtype=torch.float64)
    codec = compress.Codec(wire) if wire else None
    residuals = [compress.Residual() for _ in parts]
    for _ in range(steps):
        grad = torch.zeros(dim, dtype=torch.float32)
        for (a, b), r in zip(parts, residuals):
            g = (a.T @ (a @ w - b)).float()
            if codec is None:
                grad += g
            else:
                codec.decode_accumulate(codec.encode(g, r if ef else None), grad, "sum")
        w -= lr * grad.double()
    return _loss(parts, w)


@pytest.mark.parametrize("wire", ["fp8e4m3", "fp8e5m2"])
def test_error_feedback_reaches_uncompressed_loss(wire):
    parts = _problem()
    exact = _loss(parts, torch.linalg.lstsq(torch.cat([a for a, _ in parts]),
                                            torch.cat([b for _, b in parts])).solution)
    plain = _train(parts, None, False)
    fp8 = _train(parts, wire, False)
    fp8_ef = _train(parts, wire, True)
    print(f"{wire}: optimum {exact:.6f} uncompressed {plain:.6f} fp8 {fp8:.6f} fp8+ef {fp8_ef:.6f}")
    assert plain == pytest.approx(exact, rel=1e-6)
    # EF ends within 0.1% of the uncompressed loss ...
    assert fp8_ef <= plain * (1 + 1e-3)
    # ... and much closer to it than plain fp8, which stalls at its error floor
    # (measured: e4m3 gap 0.021 vs 0.004 with EF, e5m2 0.153 vs 0.020)
    assert fp8 - plain > 3 * (fp8_ef - plain)
