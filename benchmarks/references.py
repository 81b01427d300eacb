"""Reference implementations the benchmarks measure meanfield against.

Plain NumPy, plain JAX (the obvious ``exp(beta X X^T) X`` formulation, vmapped
over seeds, jit-compiled) and PyTorch on the CPU. ``phase_diagram_torch`` is our
re-implementation of the published simulation loop of the phase diagrams
(Geshkovski, Letrouit, Polyanskiy, Rigollet; github.com/borjanG/2023-transformers-rotf,
``phase-diagrams.py``), with the published step: a Python loop over ``beta`` and over
time steps, batched matrix products over seeds, ``softmax`` rows (SA) or
``exp(beta X X^T) / n`` (USA), ``X <- normalize(X + h A X)`` (no tangent projection),
and the clustering metric by boolean masking at the checkpoint steps.

Every function here computes the same numbers as its meanfield counterpart
(checked by ``benchmarks.cases`` before timing).
"""

from __future__ import annotations

import numpy as np

# ----------------------------------------------------------------------------
# USA velocity  v_i = P_{x_i} (1/n) sum_j exp(beta <x_i, x_j>) x_j
# ----------------------------------------------------------------------------


def usa_velocity_numpy(x: np.ndarray, beta: float) -> np.ndarray:
    """``(S, n, d) -> (S, n, d)``: batched matmuls in NumPy."""
    n = x.shape[-2]
    W = np.exp(beta * (x @ np.swapaxes(x, -1, -2)))
    F = (W @ x) / n
    return F - np.sum(F * x, axis=-1, keepdims=True) * x


def usa_velocity_jax():
    """Plain JAX: ``P_x exp(beta X X^T) X / n`` for one system, vmapped over seeds, jitted."""
    import jax
    import jax.numpy as jnp

    def one(x, beta):
        F = jnp.exp(beta * (x @ x.T)) @ x / x.shape[0]
        return F - jnp.sum(F * x, axis=-1, keepdims=True) * x

    return jax.jit(jax.vmap(one, in_axes=(0, None)))


def usa_velocity_torch(x, beta: float):
    """PyTorch (CPU): same formula with ``torch.bmm``-style batched matmuls."""
    import torch

    n = x.shape[-2]
    W = torch.exp(beta * (x @ x.transpose(-1, -2)))
    F = (W @ x) / n
    return F - (F * x).sum(-1, keepdim=True) * x


# ----------------------------------------------------------------------------
# phase diagrams in the shape of the published reference code
# ----------------------------------------------------------------------------


def phase_diagram_torch(
    x0, betas, steps_h, steps_n, ckpt, *, threshold=0.999, normalized=True, step="renormalize"
):
    """Clustering fraction ``(B, S, C)`` by a Python loop over ``beta`` and steps.

    For each ``beta``: ``N`` Euler steps of size ``h`` on the whole batch of seeds
    (``x0``: ``(S, n, d)`` torch tensor), the weight matrix by batched matmul (all ``n^2``
    exponentials): ``softmax(beta X X^T)`` rows for SA (``torch.softmax``, as the published
    code), ``exp(beta X X^T) / n`` for USA; the published step ``X <- normalize(X + h A X)``
    (``step="renormalize"``, default; ``"projected"``: ``X + h P_X (A X)``, meanfield's default),
    and at the checkpoint steps (the state after step ``idx``; ``meanfield.phase_diagram.
    published_checkpoint_steps`` gives the published code's indices) the fraction of pairs
    ``i != j`` with ``<x_i, x_j> > threshold`` by a boolean mask.
    """
    import torch

    if step not in ("renormalize", "projected"):
        raise ValueError(f"step must be 'renormalize' or 'projected', got {step!r}")
    S, n, _ = x0.shape
    eye = torch.eye(n, dtype=torch.bool)
    out = np.zeros((len(betas), S, len(ckpt[0])))
    for bi, (beta, h, N, idx) in enumerate(zip(betas, steps_h, steps_n, ckpt)):
        wanted = set(int(i) for i in idx)
        frac = {}
        x = x0.clone()
        for step in range(int(N) + 1):
            if step in wanted:
                ip = x @ x.transpose(1, 2)
                mask = (ip > threshold) & ~eye
                frac[step] = (mask.sum(dim=(1, 2)).double() / (n * (n - 1))).numpy()
            if step == N:
                break
            logits = float(beta) * (x @ x.transpose(1, 2))
            A = torch.softmax(logits, dim=-1) if normalized else torch.exp(logits) / n
            F = A @ x
            v = F - (F * x).sum(dim=-1, keepdim=True) * x if step == "projected" else F
            x = x + float(h) * v
            x = torch.nn.functional.normalize(x, dim=-1)
        out[bi] = np.stack([frac[int(i)] for i in idx], axis=1)
    return out


def phase_diagram_jax_plain(x0, betas, steps_h, steps_n, ckpt, *, threshold=0.999, normalized=True):
    """Plain JAX port: ``vmap`` over seeds, ``scan`` over steps (full ``n^2`` exponentials,
    metric by mask at every step then gathered), Python loop over ``beta``.

    ``scan`` needs a static length: one compilation per distinct step count.
    """
    import jax
    import jax.numpy as jnp

    S, n, _ = x0.shape
    eye = jnp.eye(n, dtype=bool)

    def frac(x):
        G = x @ x.T
        return jnp.sum((G > threshold) & ~eye) / (n * (n - 1))

    def step(x, beta, h):
        A = jnp.exp(beta * (x @ x.T))
        A = A / A.sum(-1, keepdims=True) if normalized else A / n
        F = A @ x
        v = F - jnp.sum(F * x, -1, keepdims=True) * x
        x = x + h * v
        return x / jnp.linalg.norm(x, axis=-1, keepdims=True)

    def run(x0, beta, h, N):
        def body(x, _):
            x = jax.vmap(step, in_axes=(0, None, None))(x, beta, h)
            return x, jax.vmap(frac)(x)

        _, fr = jax.lax.scan(body, x0, None, length=N)
        return jnp.concatenate([jax.vmap(frac)(x0)[None], fr])  # (N+1, S)

    jrun = jax.jit(run, static_argnums=3)
    out = []
    for beta, h, N, idx in zip(betas, steps_h, steps_n, ckpt):
        fr = jrun(x0, jnp.asarray(beta, x0.dtype), jnp.asarray(h, x0.dtype), int(N))
        out.append(np.asarray(fr)[np.asarray(idx)].T)
    return np.stack(out)


# ----------------------------------------------------------------------------
# thread settings of the references (fairness on a loaded machine)
# ----------------------------------------------------------------------------


def set_threads(lib: str, k: int):
    """Limit ``lib`` ("torch" or "numpy": its BLAS) to ``k`` threads; returns a restore callable."""
    if lib == "torch":
        import torch

        old = torch.get_num_threads()
        torch.set_num_threads(k)
        return lambda: torch.set_num_threads(old)
    from threadpoolctl import threadpool_limits

    lim = threadpool_limits(limits=k)
    return lim.restore_original_limits
