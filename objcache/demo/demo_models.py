"""The demo's built-in models, defined at module level (imports torch).

torch's caching precompile cannot save a package whose guards name a class defined inside a
function (docs/torch.md, "Precompile entries"), so the models the demo's worker builds
live here rather than inside :func:`objcache.demo.demo_worker.build_model`.
Their ``forward`` methods close over nothing (see that function on PGO and closures).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn import functional as F


class Salted(nn.Module):
    """A library model times the demo's constant: every demo's cold run is cold."""

    def __init__(self, inner: nn.Module, salt: float) -> None:
        super().__init__()
        self.inner = inner
        self.salt = salt

    def forward(self, x: Any) -> Any:
        return self.inner(x) * self.salt


class TextLogits(nn.Module):
    """A transformers classifier's logits times the demo's constant (token ids in)."""

    def __init__(self, inner: nn.Module, salt: float) -> None:
        super().__init__()
        self.inner = inner
        self.salt = salt

    def forward(self, x: Any) -> Any:
        return self.inner(input_ids=x).logits * self.salt


class Tiny(nn.Module):
    def __init__(self, salt: float) -> None:
        super().__init__()
        self.salt = salt
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x: Any) -> Any:
        return self.net(x) * self.salt


class Block(nn.Module):
    def __init__(self, salt: float, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.salt = salt
        self.attention = F.scaled_dot_product_attention
        self.heads = heads
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(
            nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.GELU(),
            nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d),
        )  # fmt: skip

    def forward(self, x: Any) -> Any:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        a = self.attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return (x + self.mlp(self.norm2(x))) * self.salt
