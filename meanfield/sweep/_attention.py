r"""The sweep kind ``attention``: one fixed query against ``n`` uniform keys (no dynamics).

A point ``(n, d, beta, seed)`` draws keys ``mf.sphere.uniform(jax.random.key(seed), n, d)`` and
records the ordered attention weights of the query ``e_1`` at inverse temperature ``beta``
(``mf.attention.top_weights``: ``top_weight`` $A_{(1)}$, ``top_weights`` $A_{(1..k)}$, ``ratios``
$A_{(k)} / A_{(1)}$, ``cumulative`` $\sum_{i \le k} A_{(i)}$) and ``log_partition``
$\log Z_n = \log \sum_j e^{-\beta T_j}$ (``mf.attention.log_partition``). Its one parameter is the
``beta`` of ``mf.models.SelfAttention`` (given in ``[grid]``, with the same rules as the
particle sweeps); a spec has no ``[time]``. The heatmap over ``(n, beta)`` carries the critical
scale $\beta = 2 n^{2/(d-1)}$ of long-context attention (paper Fig. 3).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .._params import Param
from .._resources import Cost
from .spec import ATTENTION_OBSERVABLES, ParticleGrid, PointProgram, Spec, register_kind

__all__ = ["Attention", "ATTENTION", "DESCRIPTIONS"]

#: Observables with one value per rank ``1..top_k`` (a ``rank`` dimension in the store).
_RANKED = ("top_weights", "ratios", "cumulative")

#: Descriptions of the data variables of an attention store.
DESCRIPTIONS = {
    "top_weight": "largest attention weight A_(1)",
    "top_weights": "ordered attention weights A_(1..k)",
    "ratios": "A_(k) / A_(1)",
    "cumulative": "sum_{i<=k} A_(i)",
    "log_partition": "log Z_n = log sum_j exp(-beta T_j)",
}


class Attention(ParticleGrid):
    """One fixed query against ``n`` uniform keys (``[model] kind = "attention"``)."""

    name: ClassVar[str] = "attention"
    summary: ClassVar[str] = "no dynamics"
    timed: ClassVar[bool] = False
    ranked: ClassVar[bool] = True
    descriptions: ClassVar[dict[str, str]] = DESCRIPTIONS

    def spec_names(self) -> tuple[str, ...]:
        return (self.name,)

    def model_params(self, model: str) -> tuple[Param, ...]:
        """``beta``, the inverse temperature of ``mf.models.SelfAttention``."""
        from ..models import SelfAttention

        return tuple(p for p in SelfAttention.params() if p.name == "beta")

    def observables(self, kinds: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return ATTENTION_OBSERVABLES, ("top_weight",)

    def point_memory(self, spec: Spec, model: str, n: int, d: int) -> int:
        """The ``(n, d)`` keys with their Gaussian draws and a few ``(n,)`` vectors."""
        b = 8 if spec.dtype == "float64" else 4
        return b * (3 * n * d + 6 * n + 4 * spec.top_k) + 256

    def cost(self, spec: Spec, model: str, n: int, d: int, batch: int, point_bytes: int) -> Cost:
        r"""``point_memory`` per point and $n (2 d + 10)$ flop per point (one context, no steps)."""
        return Cost(
            steps=0,
            saves=0,
            bytes=point_bytes * batch,
            work=float(batch) * n * (2.0 * d + 10.0),
            batch=batch,
        )

    def point_program(self, spec: Spec, model: str, n: int, d: int) -> PointProgram:
        import jax
        import jax.numpy as jnp

        from .. import attention, sphere
        from . import store

        dtype = jnp.dtype(spec.dtype)
        k = spec.top_k
        q = jnp.zeros((d,), dtype).at[0].set(1.0)  # keys are uniform: any fixed query is alike

        def attn(params: dict[str, Any], seed: Any) -> dict[str, Any]:
            keys = sphere.uniform(jax.random.key(seed), n, d, dtype)
            beta = params["beta"].astype(dtype)
            w = attention.top_weights(q, keys, beta, k)
            out = {
                "top_weight": w[0],
                "top_weights": w,
                "ratios": w / w[0],
                "cumulative": jnp.cumsum(w),
                "log_partition": attention.log_partition(q, keys, beta),
            }
            out = {o: out[o] for o in spec.observables}
            ok = jnp.all(jnp.stack([jnp.all(jnp.isfinite(v)) for v in out.values()]))
            out["status"] = jnp.where(ok, store.OK, store.FAILED).astype(jnp.int8)
            return out

        return attn

    def output_layout(self, spec: Spec) -> dict[str, tuple[str, ...]]:
        return {o: (("rank",) if o in _RANKED else ()) for o in spec.observables}

    def point_store_bytes(self, spec: Spec) -> int:
        b = 8 if spec.dtype == "float64" else 4
        return sum(spec.top_k if o in _RANKED else 1 for o in spec.observables) * b + 1

    def decorate_heatmap(self, ax: Any, heat: Any, ds: Any, a: str, b: str) -> None:
        """Over ``(n, beta)``: the critical scale of long-context attention, ``beta = 2 n^(2/(d-1))``
        (paper Fig. 3)."""
        if (a, b) != ("n", "beta") or "d" not in ds.attrs:
            return
        nn = heat["n"].values.astype(float)
        crit = 2.0 * nn ** (2.0 / (int(ds.attrs["d"]) - 1))
        lb = np.log(heat["beta"].values.astype(float))
        ax.plot(
            range(len(nn)),
            np.interp(np.log(crit), lb, np.arange(len(lb)), left=np.nan, right=np.nan),
            "w--",
            label="beta = 2 n^alpha",
        )
        ax.legend(fontsize=7, loc="lower right")


#: The kind object (registered).
ATTENTION = register_kind(Attention())
