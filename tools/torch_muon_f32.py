"""tools/torch_muon_f32.py — torch.optim.Muon with its Newton-Schulz in float32: the fp32 reference that tools/gen_golden_muon.py writes and bench/compare_torch_muon.py times.

torch's Muon (2.9+) orthogonalises a bfloat16 copy; shardopt also runs the iteration in fp32
(config.muon.precision = f32). The reference is torch's own Muon with _zeropower_via_newtonschulz
replaced by the identical iteration on a float32 copy, nothing else changed. Needs torch >= 2.9.
"""
import contextlib

import torch
import torch.optim._muon as muon_module


def zeropower_f32(grad, ns_coefficients, ns_steps, eps):
    """torch's _zeropower_via_newtonschulz with float32 where it uses bfloat16, nothing else."""
    a, b, c = ns_coefficients
    ortho_grad = grad.to(dtype=torch.float32, copy=True)
    if grad.size(0) > grad.size(1):
        ortho_grad = ortho_grad.T
    ortho_grad.div_(ortho_grad.norm().clamp(min=eps))
    for _ in range(ns_steps):
        gram_matrix = ortho_grad @ ortho_grad.T
        gram_update = torch.addmm(gram_matrix, gram_matrix, gram_matrix, beta=b, alpha=c)
        ortho_grad = torch.addmm(ortho_grad, gram_update, ortho_grad, beta=a)
    if grad.size(0) > grad.size(1):
        ortho_grad = ortho_grad.T
    return ortho_grad


@contextlib.contextmanager
def muon_newton_schulz(precision):
    """torch.optim.Muon orthogonalises in `precision` ("bf16": torch's own, "f32": zeropower_f32) inside."""
    original = muon_module._zeropower_via_newtonschulz
    if precision == "f32":
        muon_module._zeropower_via_newtonschulz = zeropower_f32
    try:
        yield
    finally:
        muon_module._zeropower_via_newtonschulz = original
