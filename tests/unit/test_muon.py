"""Muon against the published update written out here, against the SVD, and its AdamW
groups against torch's AdamW."""

from __future__ import annotations

import pytest
import torch

from tandem.optim import Muon
from tandem.optim.muon import _balance, orthogonalize


def published_orthogonalize(g: torch.Tensor) -> torch.Tensor:
    """zeropower_via_newtonschulz5 of Jordan et al. (five steps), in float32."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    x = g.float()
    if g.size(-2) > g.size(-1):
        x = x.mT
    x = x / (x.norm() + 1e-7)
    for _ in range(5):
        m = x @ x.mT
        x = a * x + (b * m + c * m @ m) @ x
    if g.size(-2) > g.size(-1):
        x = x.mT
    return x


@pytest.mark.parametrize("shape", [(16, 40), (40, 16), (8, 3, 5)])
def test_orthogonalize_approaches_u_vt(shape: tuple[int, ...]) -> None:
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    got = orthogonalize(g)
    matrix = g.reshape(shape[0], -1)
    torch.testing.assert_close(got.reshape(shape[0], -1), published_orthogonalize(matrix))
    u, _, vh = torch.linalg.svd(matrix, full_matrices=False)
    values = torch.linalg.svdvals(got.reshape(shape[0], -1))
    assert values.min() > 0.6 and values.max() < 1.25  # the quintic's band around 1
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), (u @ vh).flatten(), dim=0)
    assert cosine > 0.95


def test_muon_steps_match_the_update_rule() -> None:
    gen = torch.Generator().manual_seed(1)
    w0 = torch.randn(12, 20, generator=gen)
    grads = [torch.randn(12, 20, generator=gen) for _ in range(3)]
    param = torch.nn.Parameter(w0.clone())
    opt = Muon([param], lr=0.05, momentum=0.9, weight_decay=0.1)
    w, m = w0.clone(), torch.zeros_like(w0)
    for g in grads:
        param.grad = g.clone()
        opt.step()
        m = 0.9 * m + 0.1 * g
        u = 0.1 * g + 0.9 * m
        w = w * (1 - 0.05 * 0.1) - 0.05 * published_orthogonalize(u) * max(1, 12 / 20) ** 0.5
    torch.testing.assert_close(param.detach(), w, rtol=1e-5, atol=1e-6)


def test_adamw_groups_are_torchs_adamw() -> None:
    gen = torch.Generator().manual_seed(2)
    a = torch.nn.Parameter(torch.randn(7, generator=gen))
    b = torch.nn.Parameter(a.detach().clone())
    mine = Muon([{"params": [a], "muon": False, "lr": 1e-2, "betas": (0.8, 0.99),
                  "weight_decay": 0.1}])
    ref = torch.optim.AdamW([b], lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1, eps=1e-8)
    for _ in range(4):
        g = torch.randn(7, generator=gen)
        a.grad, b.grad = g.clone(), g.clone()
        mine.step()
        ref.step()
    torch.testing.assert_close(a.detach(), b.detach())


def test_vectors_in_a_muon_group_are_refused() -> None:
    with pytest.raises(ValueError, match="muon=False"):
        Muon([torch.nn.Parameter(torch.zeros(3))])


def test_balance_splits_the_work_evenly() -> None:
    owner = _balance([100, 10, 90, 20, 50, 50], 2)
    loads = [sum(s for s, o in zip([100, 10, 90, 20, 50, 50], owner, strict=True) if o == r)
             for r in range(2)]
    assert sorted(loads) == [160, 160]
