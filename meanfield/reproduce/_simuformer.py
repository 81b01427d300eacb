r"""simuformer's update written out in NumPy (float64): the reference of ``meanfield reproduce dynamics``.

A transcription of ``SimuXForm.step`` of ``nikitus20/simuformer`` (``simuxform.py``, commit
1959a8a, 2025-05-04; the line numbers below are that file's), the simulator of the normalisation
schemes by the first author of Karagodin, Ge, Polyanskiy, Rigollet, "Normalization in Attention
Dynamics" (arXiv 2510.22026). Row-vector convention as in the source: ``x`` has shape
``(..., n, d)``, one token per row; the value matrix acts on the right of a row (meanfield's ``V``
is its transpose) and the bilinear form ``BF`` plays $Q^\top K$. The tests
(``tests/_reference_sims.py``) import these functions: there is one transcription.

Per step, with $A = $ ``simuformer_field`` computed on the unit rows $\theta$ (simuxform.py:268-323)
and ``eta`` the step (``--norm``, :326-377):

* ``postln``: $\theta \leftarrow \mathrm{normalize}(\theta + \eta A)$;
* ``preln``: $r \leftarrow r + \eta\, r \sum_k A_k$, then
  $\theta \leftarrow \mathrm{normalize}(\theta + \eta (A - \langle\theta, A\rangle\theta) / (r + 10^{-9}))$;
* ``periln``: $a = A / (\|A\| + 10^{-9})$, $r \leftarrow r + \eta\, r \sum_k a_k$, then
  $\theta \leftarrow \mathrm{normalize}(\theta + \eta\, a / (r + 10^{-9}))$;
* ``ngpt``: $\theta \leftarrow \mathrm{normalize}(\theta + 0.2\,\eta A / (\|A\| + 10^{-9}))$.

The code's radial law ``torch.sum(self.r.unsqueeze(-1) * A, dim=-1)`` is $r \mathbf 1^\top A$
(the sum of the components of $A$, times $r$), not the paper's $\dot r = \langle\theta, A\rangle$
(Pre-LN) and $\langle\theta, A\rangle / \|A\|$ (Peri-LN, Table 2): ``radial="paper"`` replaces it by
the paper's law, everything else kept (the semi-implicit Euler step: $\theta$ moves with the new
radius, then is renormalised).
"""

from __future__ import annotations

import math

import numpy as np
from jaxtyping import ArrayLike

__all__ = [
    "SIMUFORMER_NORMS",
    "simuformer_eta",
    "simuformer_attention",
    "simuformer_field",
    "simuformer_step",
    "simuformer_regenerates",
]

#: simuformer's ``--norm`` choices (runner.py:49): no Mix-LN and no LN-scaling.
SIMUFORMER_NORMS = ("postln", "preln", "periln", "ngpt")


def simuformer_eta(
    step: float, beta: float, *, use_softmax: bool = True, rawstep: bool = False
) -> float:
    """The step size ``eta`` of ``SimuXForm.__init__`` (simuxform.py:27-35).

    ``eta = step`` with softmax (the default) or ``rawstep``; without softmax
    ``eta = step / max(sqrt(beta) exp(beta - 1/2), 1)``.
    """
    if not use_softmax and not rawstep:
        denom = max(math.sqrt(beta) * math.exp(beta - 0.5), 1.0)
        return step / denom if denom > 0 else step
    return step


def simuformer_attention(
    x: ArrayLike,
    BF: ArrayLike,
    beta: float,
    *,
    sequential: bool = False,
    use_softmax: bool = True,
) -> np.ndarray:
    """One head's attention matrix ``SM`` of ``SimuXForm.step`` (simuxform.py:297-312).

    ``SM_ij = softmax_j(beta * (x_i^T BF x_j + mask_ij))`` with ``mask_ij = -inf`` for ``j > i``
    when ``sequential`` (the mask is added before the multiplication by beta, so ``beta = 0``
    with ``sequential`` gives NaN, as in torch); ``exp(...)`` without normalisation when
    ``use_softmax=False``. ``x``: ``(..., n, d)``; ``BF``: ``(d, d)`` or ``(..., d, d)``.
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[-2]
    sm = x @ np.asarray(BF, dtype=np.float64) @ np.swapaxes(x, -1, -2)
    if sequential:
        sm = sm + np.triu(np.full((n, n), -np.inf), k=1)
    sm = sm * beta
    if use_softmax:
        sm = np.exp(sm - np.max(sm, axis=-1, keepdims=True))
        return np.asarray(sm / np.sum(sm, axis=-1, keepdims=True))
    return np.asarray(np.exp(sm))


def simuformer_field(
    x: ArrayLike,
    BF: ArrayLike,
    V: ArrayLike,
    beta: float,
    *,
    sequential: bool = False,
    use_softmax: bool = True,
) -> np.ndarray:
    """The aggregated attention output ``A = M2`` of ``SimuXForm.step`` (simuxform.py:268-323).

    ``A = (1/H) sum_h SM_h @ x @ V_h``, i.e. ``A_i = (1/H) sum_h sum_j SM^h_ij V_h^T x_j`` in
    column form (the value matrix acts on the right of the row vector ``x_j``).
    ``BF``, ``V``: stacks ``(H, d, d)`` (or ``(H, ..., d, d)`` with one matrix per system).
    """
    x = np.asarray(x, dtype=np.float64)
    BF = np.asarray(BF, dtype=np.float64)
    V = np.asarray(V, dtype=np.float64)
    n_heads = BF.shape[0]
    out = np.zeros_like(x)
    for h in range(n_heads):
        sm = simuformer_attention(x, BF[h], beta, sequential=sequential, use_softmax=use_softmax)
        out = out + (sm @ (x @ V[h])) / n_heads
    return out


def _normalize_rows(x: np.ndarray) -> np.ndarray:
    # torch.nn.functional.normalize(x, dim=-1): x / max(|x|, 1e-12)
    return np.asarray(x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12))


def simuformer_step(
    x: ArrayLike,
    BF: ArrayLike,
    V: ArrayLike,
    beta: float,
    eta: float,
    *,
    norm: str = "postln",
    sequential: bool = False,
    use_softmax: bool = True,
    r: ArrayLike | None = None,
    norm_eps: float = 1e-9,
    radius_eps: float = 1e-9,
    radial: str = "simuformer",
) -> tuple[np.ndarray, np.ndarray]:
    """One call of ``SimuXForm.step`` (simuxform.py:250-380), without the clock.

    With ``A = simuformer_field(x, BF, V, beta, ...)`` (per token, row ``A_i``):

    - ``"postln"`` (:326-331): ``x <- normalize(x + eta A)``;
    - ``"preln"`` (:333-349): ``r <- r + eta r sum_k A_ik`` (the code's ``<r, A>`` is ``r``
      times the *sum of the components* of ``A_i``), then
      ``x <- normalize(x + eta (A - <x, A> x) / (r_new + 1e-9))``;
    - ``"periln"`` (:351-365): ``a = A / (|A| + 1e-9)``; ``r <- r + eta r sum_k a_ik``;
      ``x <- normalize(x + eta a / (r_new + 1e-9))``;
    - ``"ngpt"`` (:367-377): ``x <- normalize(x + eta 0.2 A / (|A| + 1e-9))``.

    ``r`` (shape ``x.shape[:-1]``) starts at ones (:43) and is carried between steps; only
    preln and periln change it. ``norm_eps`` is the ``1e-9`` that ngpt and periln add to ``|A|``
    (0 gives the exact ``A / |A|`` of the nGPT paper), ``radius_eps`` the ``1e-9`` that preln and
    periln add to ``r``. ``radial="paper"`` replaces the radial law by the paper's
    (``r <- r + eta <x, A>``, periln ``r <- r + eta <x, a>``; Table 2 of arXiv 2510.22026).
    Returns ``(x_new, r_new)``. The clock and the regeneration of random weights
    (``randomKQ``/``randomV`` = 5, :383-395) are not part of this function.
    """
    if norm not in SIMUFORMER_NORMS:
        raise ValueError(f"Unknown normalization mode: {norm}")
    if radial not in ("simuformer", "paper"):
        raise ValueError(f"radial must be 'simuformer' or 'paper', got {radial!r}")
    x = np.asarray(x, dtype=np.float64)
    rad: np.ndarray = np.ones(x.shape[:-1]) if r is None else np.asarray(r, dtype=np.float64)
    A = simuformer_field(x, BF, V, beta, sequential=sequential, use_softmax=use_softmax)
    if norm == "postln":
        return _normalize_rows(x + eta * A), rad
    if norm == "preln":
        if radial == "paper":
            rad = rad + eta * np.sum(x * A, axis=-1)
        else:
            rad = rad + eta * np.sum(rad[..., None] * A, axis=-1)
        tangent = A - np.sum(x * A, axis=-1, keepdims=True) * x
        return _normalize_rows(x + eta * tangent / (rad[..., None] + radius_eps)), rad
    a = A / (np.linalg.norm(A, axis=-1, keepdims=True) + norm_eps)
    if norm == "periln":
        if radial == "paper":
            rad = rad + eta * np.sum(x * a, axis=-1)
        else:
            rad = rad + eta * np.sum(rad[..., None] * a, axis=-1)
        return _normalize_rows(x + eta * a / (rad[..., None] + radius_eps)), rad
    return _normalize_rows(x + eta * 0.2 * a), rad  # ngpt: fixed alpha = 0.2


def simuformer_regenerates(
    current_time: float, eta: float, last_regen_time_int: int
) -> tuple[bool, float, int]:
    """Whether ``SimuXForm.step`` redraws KQ/V after this step in mode 5 (simuxform.py:383-392).

    ``new_time = current_time + eta``; a redraw happens (after the step, which used the old
    matrices) when ``floor(new_time) > last_regen_time_int``, which starts at -1 (:39): so the
    first step is always followed by a redraw, then one after every integer time crossed.
    Returns ``(redraw, new_time, new_last_regen_time_int)``.
    """
    new_time = current_time + eta
    new_int = math.floor(new_time)
    if new_int > last_regen_time_int:
        return True, new_time, new_int
    return False, new_time, last_regen_time_int
