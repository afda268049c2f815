"""The gradient noise scale estimator recovers a known tr(Sigma) / |G|^2."""

from __future__ import annotations

import torch

from tandem.monitor.noise import NoiseScale


def test_estimate_recovers_a_known_noise_scale() -> None:
    # Per-sample gradients G + e, e ~ N(0, s^2 I) in d dimensions: tr(Sigma) = d s^2.
    g = torch.Generator().manual_seed(0)
    d, sigma, b_small, b_big = 200, 0.5, 16, 64
    true_grad = torch.randn(d, generator=g) * 0.1
    want = d * sigma**2 / float(true_grad.pow(2).sum())
    noise = NoiseScale(smoothing=0.05)
    for _ in range(400):
        samples = true_grad + sigma * torch.randn(b_big, d, generator=g)
        small = samples[:b_small].mean(0).pow(2).sum().item()
        big = samples.mean(0).pow(2).sum().item()
        noise.update(small, big, b_small, b_big)
    got = noise.value()
    assert got is not None and abs(got - want) / want < 0.15, (got, want)


def test_no_estimate_without_a_bigger_batch_or_a_positive_gradient() -> None:
    noise = NoiseScale()
    noise.update(1.0, 1.0, 32, 32)  # the same batch twice says nothing
    assert noise.value() is None
    noise.update(1.0, 2.0, 8, 32)  # |g_big| > |g_small|: a negative trace estimate
    assert noise.value() is None
