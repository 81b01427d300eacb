r"""Closed forms and limit laws from the papers (MATH.md).

Section 1 (USA-AV particle dynamics) first: the maximal energy $e^\beta / (2\beta)$ of the
exp-gauge kernels, the great circle, the RoPE latitude circle. The long-context attention laws
(MATH.md Sec. 2) follow: a fixed query $q$, keys $x_j$ i.i.d. with density $\rho$ on
$S^{d-1}$, distances $T_j = 1 - \langle q, x_j\rangle$, weights
$A_j = e^{-\beta T_j} / Z_n$, governed by the small-$T$ tail
$P(T < t) \sim C(q)\, t^{1/\alpha}$ with $\alpha = 2/(d-1)$.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammainc, gammaincc
from jaxtyping import Array, ArrayLike, Float

from ._checks import check_finite, check_int, check_nonnegative, check_plane, check_positive

__all__ = [
    "max_energy",
    "great_circle_gap",
    "great_circle_energy",
    "latitude_height",
    # Section 2: long-context attention
    "attention_alpha",
    "critical_beta",
    "tail_constant",
    "window_size",
    "subcritical_profile",
    "cumulative_profile",
    "partition_function",
    "partition_function_uniform",
    "critical_weights",
    "drift",
]


# --------------------------------------------------------------------------
# Section 1: USA-AV
# --------------------------------------------------------------------------


def max_energy(beta, *, rescaled: bool = False):
    r"""Maximal energy of every exp-gauge kernel (USA, RoPE, phase field, gauge, prompt).

    $h \le e^\beta / \beta$, so $E = \frac{1}{2 n^2} \sum_{i,j} h(z_i, z_j) \le e^\beta / (2 \beta)$,
    attained by the maximisers (Dirac in the gauge frame), for any finite $n$.
    With ``rescaled=True`` (the time-rescaled kernels, $h e^{-\beta}$) it is $1 / (2 \beta)$.

    Args:
        beta: inverse temperature, ``> 0`` (scalar or array).
        rescaled: the ``e^{-beta}``-rescaled kernels.

    Returns:
        $E_{\max}$, same shape as ``beta``.

    Example:
        >>> import meanfield as mf
        >>> round(float(mf.theory.max_energy(1.0)), 4)   # e / 2
        1.3591
    """
    check_positive("beta", beta)
    beta = jnp.asarray(beta)
    if rescaled:
        return 1.0 / (2.0 * beta)
    return jnp.exp(beta) / (2.0 * beta)


def great_circle_gap(n):
    r"""$G_x$ of $n$ equally spaced points on a great circle: $1 + 1/(n-1)$.

    ($\sum_{i,j} \langle x_i, x_j\rangle = 0$, so $G_x = 1 + n/(n(n-1))$.)

    Args:
        n: number of points, ``n >= 2``.

    Returns:
        float $1 + 1/(n-1)$.

    Example:
        >>> import meanfield as mf
        >>> mf.theory.great_circle_gap(5)
        1.25
    """
    n = check_int("n", n, minimum=2)
    return 1.0 + 1.0 / (n - 1)


def great_circle_energy(m=1):
    r"""Maximal energy of the Toeplitz kernel $\cos(2 \pi m (t-s)) \langle x, y\rangle$: $1/4$.

    Attained by $x(s) = \cos(2 \pi m s)\, a + \sin(2 \pi m s)\, b$ (the uniform great circle
    traversed $m$ times): $E = \frac12 \operatorname{mean}_{s,t} \cos^2(2 \pi m (t-s)) = 1/4$.

    Args:
        m: the Toeplitz frequency, ``m >= 1``.

    Returns:
        ``0.25`` (independent of ``m``).

    Example:
        >>> import meanfield as mf
        >>> mf.theory.great_circle_energy(2)
        0.25
    """
    check_int("m", m, minimum=1)
    return 0.25


def latitude_height(u, plane=(0, 1)):
    r"""Height of the RoPE latitude circle $x(s) = R_{-\omega s} u$: $\|P_{E^\perp} u\|$, $E = \operatorname{span}(e_a, e_b)$.

    A rotation in $\operatorname{span}(e_a, e_b)$ fixes the orthogonal complement, so the
    circle lies at $\|P_{E^\perp} u\|$ from the plane $E$: the norm of the
    components of $u$ outside ``plane``.

    Args:
        u: ``(..., d)`` unit vector(s).
        plane: the rotation plane ``(a, b)``.

    Returns:
        array of shape ``u.shape[:-1]``.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> round(float(mf.theory.latitude_height(jnp.array([0.6, 0.0, 0.8]))), 4)
        0.8
    """
    u = jnp.asarray(u)
    a, b = check_plane(plane, u.shape[-1])
    mask = jnp.ones(u.shape[-1], dtype=bool).at[a].set(False).at[b].set(False)
    return jnp.sqrt(jnp.sum(jnp.where(mask, u * u, 0.0), axis=-1))


# --------------------------------------------------------------------------
# Section 2: long-context attention (MATH.md Sec. 2)
# --------------------------------------------------------------------------
# Fixed query q, keys x_j i.i.d. rho on S^{d-1}, D2Q T_j = 1 - <q, x_j>,
# A_j = exp(-beta T_j) / Z_n.  Everything is governed by the small-T tail
# P(T < t) ~ C(q) t^{1/alpha}, alpha = 2 / (d - 1).


def attention_alpha(d) -> float:
    r"""Tail exponent $\alpha = 2 / (d - 1)$ of $P(T < t) \sim C t^{1/\alpha}$ on $S^{d-1}$.

    Args:
        d: ambient dimension, ``d >= 2``.

    Returns:
        $\alpha$ as a float.

    Example:
        >>> import meanfield as mf
        >>> mf.theory.attention_alpha(5)
        0.5
    """
    d = check_int("d", d, minimum=2)
    return 2.0 / (d - 1)


def critical_beta(n, d):
    r"""Critical inverse temperature $\beta^*_n = n^\alpha = n^{2/(d-1)}$.

    Below it ($\beta \ll n^\alpha$) the softmax averages over a diverging window,
    at it finitely many keys share the mass (Poisson limit), above it the
    nearest key takes everything (paper Sec. 3).

    Args:
        n: context length(s), ``> 0`` (scalar or array).
        d: ambient dimension, ``d >= 2``.

    Returns:
        $n^\alpha$, same shape as ``n``.

    Example:
        >>> import meanfield as mf
        >>> float(mf.theory.critical_beta(10_000, 5))
        100.0
    """
    alpha = attention_alpha(d)
    check_positive("n", n)
    return jnp.asarray(n, dtype=jnp.result_type(float)) ** alpha


def tail_constant(d, density=None):
    r"""Tail constant $C(q)$ of $P(T < t) \sim C(q)\, t^{1/\alpha}$.

    $C(q) = \rho(q)\, \omega_{d-1}\, 2^{(d-1)/2}$, with $\omega_{d-1} = \pi^{(d-1)/2} / \Gamma((d+1)/2)$
    the volume of the unit $(d-1)$-ball. With ``density=None`` the keys are
    uniform: $\rho = 1 / |S^{d-1}| = \Gamma(d/2) / (2 \pi^{d/2})$ ($d = 5$: $C = 0.75$).

    Args:
        d: ambient dimension, ``d >= 2``.
        density: optional value $\rho(q) > 0$ of the key density (w.r.t. surface
            measure) at the query; scalar or array.

    Returns:
        $C(q)$ (a float for uniform keys, an array otherwise).

    Example:
        >>> import meanfield as mf
        >>> round(float(mf.theory.tail_constant(5)), 12)
        0.75
    """
    d = check_int("d", d, minimum=2)
    ball = math.pi ** ((d - 1) / 2) / math.gamma((d + 1) / 2)
    factor = ball * 2.0 ** ((d - 1) / 2)
    if density is None:
        return factor * math.gamma(d / 2) / (2.0 * math.pi ** (d / 2))
    check_positive("density", density)
    return jnp.asarray(density) * factor


def window_size(n, beta, d, density=None):
    r"""Active softmax window $m_n(q) = C(q)\, n\, \beta^{-1/\alpha}$.

    The expected number of keys with $T_j < 1/\beta$ (up to $\Gamma$ factors):
    the number of keys sharing the attention mass in the subcritical regime.

    Args:
        n: context length(s), ``> 0``.
        beta: inverse temperature(s), ``> 0``.
        d: ambient dimension, ``d >= 2``.
        density: optional key density ``rho(q)`` at the query (default uniform).

    Returns:
        $m_n(q)$, broadcast shape of ``n``, ``beta`` and ``density``.

    Example:
        >>> import meanfield as mf
        >>> float(mf.theory.window_size(1000, 4.0, 5))  # 0.75 * 1000 / 16
        46.875
    """
    alpha = attention_alpha(d)
    check_positive("n", n)
    check_positive("beta", beta)
    C = tail_constant(d, density)
    return C * jnp.asarray(n, dtype=jnp.result_type(float)) * jnp.asarray(beta, dtype=jnp.result_type(float)) ** (
        -1.0 / alpha
    )


def subcritical_profile(x, d):
    r"""Subcritical ordered-weight profile $A_{(k)} / A_{(1)} \to e^{-x^\alpha}$, $x = k / m_n$.

    Args:
        x: rank(s) in window units, ``>= 0``.
        d: ambient dimension, ``d >= 2``.

    Returns:
        $e^{-x^\alpha}$, same shape as ``x``.

    Example:
        >>> import meanfield as mf
        >>> round(float(mf.theory.subcritical_profile(4.0, 5)), 6)  # exp(-2)
        0.135335
    """
    alpha = attention_alpha(d)
    check_nonnegative("x", x)
    return jnp.exp(-(jnp.asarray(x, dtype=jnp.result_type(float)) ** alpha))


def cumulative_profile(x, d):
    r"""Subcritical cumulative weight $\sum_{i \le x m_n} A_{(i)} \to P(1/\alpha, x^\alpha)$.

    $P$ is the regularised lower incomplete gamma function; it is the
    normalised integral of $e^{-y^\alpha}$:
    $\int_0^x e^{-y^\alpha}\, dy \,/\, \Gamma(1/\alpha + 1)$.

    Args:
        x: rank(s) in window units, ``>= 0``.
        d: ambient dimension, ``d >= 2``.

    Returns:
        $P(1/\alpha, x^\alpha)$ in $[0, 1]$, same shape as ``x``.

    Example:
        >>> import meanfield as mf
        >>> round(float(mf.theory.cumulative_profile(1.0, 3)), 4)  # 1 - exp(-1)
        0.6321
    """
    alpha = attention_alpha(d)
    check_nonnegative("x", x)
    x = jnp.asarray(x, dtype=jnp.result_type(float))
    return gammainc(1.0 / alpha, x**alpha)


def partition_function(n, beta, d, density=None):
    r"""Subcritical mean partition function $E[Z_n] \sim C\, n\, \beta^{-1/\alpha}\, \Gamma(1/\alpha + 1)$.

    $Z_n = \sum_j e^{-\beta T_j}$; the asymptotic holds for $\beta \to \infty$
    (relative corrections $O(1/\beta)$; see ``partition_function_uniform``
    for the exact mean under uniform keys).

    Args:
        n: context length(s), ``> 0``.
        beta: inverse temperature(s), ``> 0``.
        d: ambient dimension, ``d >= 2``.
        density: optional key density ``rho(q)`` at the query (default uniform).

    Returns:
        the asymptotic $E[Z_n]$, broadcast shape of the arguments.

    Example:
        >>> import meanfield as mf
        >>> float(mf.theory.partition_function(1000, 10.0, 5))  # 0.75 * 1000 / 100 * 2
        15.0
    """
    alpha = attention_alpha(d)
    return window_size(n, beta, d, density) * math.gamma(1.0 / alpha + 1.0)


def partition_function_uniform(n, beta, d) -> np.ndarray | np.float64:
    r"""Exact $E[Z_n] = n\, E[e^{-\beta T}]$ for keys uniform on $S^{d-1}$.

    $\langle q, x\rangle$ has density $\propto (1 - u^2)^{(d-3)/2}$ on $[-1, 1]$, so

    $$E[e^{-\beta T}] = e^{-\beta}\, \Gamma(d/2)\, (2/\beta)^{d/2 - 1} I_{d/2-1}(\beta)$$

    ($I_\nu$ the modified Bessel function), evaluated with the exponentially scaled
    ``scipy.special.ive`` so that large $\beta$ does not overflow. Not traceable
    (NumPy/SciPy); $\beta = 0$ gives $n$.

    Args:
        n: context length(s), ``> 0``.
        beta: inverse temperature(s), ``>= 0``.
        d: ambient dimension, ``d >= 2``.

    Returns:
        NumPy array $E[Z_n]$, broadcast shape of ``n`` and ``beta`` (a ``np.float64`` for
        scalar arguments).

    Example:
        >>> import meanfield as mf
        >>> float(mf.theory.partition_function_uniform(1, 0.0, 3))
        1.0
        >>> round(float(mf.theory.partition_function_uniform(1, 2.0, 3)), 6)  # (1 - e^-4) / 4
        0.245421
    """
    from scipy.special import ive  # local: keeps scipy off the import path of jax users

    d = check_int("d", d, minimum=2)
    check_positive("n", n)
    check_nonnegative("beta", beta)
    n = np.asarray(n, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    nu = d / 2 - 1
    b = np.where(beta > 0, beta, 1.0)
    # ive(nu, b) = I_nu(b) e^{-b}; Gamma(d/2) (2/b)^nu I_nu(b) -> 1 as b -> 0.
    mean = np.where(beta > 0, math.gamma(d / 2) * (2.0 / b) ** nu * ive(nu, b), 1.0)
    return n * mean


def critical_weights(
    key, gamma, d, k, num, *, density=None, terms=512, batch_size=1024
) -> Float[Array, "num k"]:
    r"""Samples of the critical limit law $(W_1, \dots, W_k)$ of the ordered weights.

    At $\beta = \gamma n^\alpha$ the rescaled distances $\beta T_{(l)}$ converge to a
    Poisson process with mean measure $c\, y^{1/\alpha}$, $c = C \gamma^{-1/\alpha}$:
    $y_l = (\Gamma_l / c)^\alpha$ with $\Gamma_l$ partial sums of i.i.d. Exp(1),
    and $W_k = e^{-y_k} / \sum_l e^{-y_l}$ (paper Thm 3.2, MATH.md Sec. 2).

    The first ``terms`` points are sampled exactly; the rest of the denominator
    is replaced by its conditional mean
    $\sum_{y > y_L} e^{-y} \to c\, \Gamma(1/\alpha + 1)\, Q(1/\alpha, y_L)$ ($Q$ the regularised
    upper incomplete gamma), whose relative fluctuation is below 1% for the defaults.

    Args:
        key: a ``jax.random`` key.
        gamma: critical ratio $\beta / n^\alpha > 0$ (traceable scalar).
        d: ambient dimension, ``d >= 2``.
        k: number of leading weights returned, ``1 <= k <= terms``.
        num: number of samples.
        density: optional key density $\rho(q)$ at the query (uniform if None).
        terms: number of Poisson points sampled exactly.
        batch_size: samples drawn per vectorised batch (bounds memory).

    Returns:
        ``(num, k)`` array, rows decreasing, $W_1 + \dots + W_k \le 1$.

    Example:
        >>> import jax, meanfield as mf
        >>> W = mf.theory.critical_weights(jax.random.key(0), 1.0, 5, 2, 4000)
        >>> bool(abs(W[:, 0].mean() - 0.277) < 0.03)
        True
    """
    alpha = attention_alpha(d)
    k = check_int("k", k, minimum=1)
    num = check_int("num", num, minimum=1)
    terms = check_int("terms", terms, minimum=k)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    check_positive("gamma", gamma)
    C = tail_constant(d, density)
    return _critical_weights(key, jnp.asarray(gamma), jnp.asarray(C), alpha, k, num, terms, min(batch_size, num))


@functools.partial(jax.jit, static_argnums=(3, 4, 5, 6, 7))
def _critical_weights(key, gamma, C, alpha, k, num, terms, batch_size):
    dtype = jnp.result_type(float)
    c = C.astype(dtype) * gamma.astype(dtype) ** (-1.0 / alpha)
    log_tail_scale = jnp.log(c) + math.lgamma(1.0 / alpha + 1.0)
    s = 1.0 / alpha  # = (d - 1)/2

    def log_q_shifted(y_last, y_first):
        # log(Q(s, y_L) e^{y_1}); for integer s (odd d) Q(s, y) = e^{-y} sum_{j<s} y^j / j!
        # (closed form: no overflow of e^{y_1}, cheap to compile), else jax's gammaincc.
        if float(s).is_integer():
            terms_ = sum(y_last**j / math.factorial(j) for j in range(int(s)))
            return jnp.log(terms_) - (y_last - y_first)
        return jnp.log(gammaincc(s, y_last)) + y_first

    def one(sample_key):
        gaps = jax.random.exponential(sample_key, (terms,), dtype=dtype)
        y = (jnp.cumsum(gaps) / c) ** alpha
        # shift by y_1: W_k = exp(-(y_k - y_1)) / (sum_l exp(-(y_l - y_1)) + tail e^{y_1})
        head = jnp.exp(-(y - y[0]))
        tail = jnp.exp(log_tail_scale + log_q_shifted(y[-1], y[0]))
        return head[:k] / (jnp.sum(head) + tail)

    keys = jax.random.split(key, num)
    return jax.lax.map(one, keys, batch_size=batch_size)


def drift(q: ArrayLike, log_density) -> Float[Array, " d"]:
    r"""Subcritical drift $Y(q) = \nabla_S \log \rho(q) - \frac{d-1}{2} q$ (paper Thm 4.3).

    $\beta Y_n(q) \to Y(q)$ when $\beta^{1+\alpha} n^{-\alpha} \to 0$. The
    spherical gradient is the tangent projection $P_q \nabla \log \rho(q)$ of the
    ambient gradient of ``log_density`` (computed by autodiff); an unnormalised
    log-density is fine.

    Args:
        q: unit query, shape ``(d,)``.
        log_density: ``x (d,) -> log rho(x)`` (scalar), differentiable.

    Returns:
        ``(d,)`` drift; its tangent part is $\nabla_S \log \rho(q)$ and
        $\langle Y(q), q\rangle = -(d-1)/2$.

    Example:
        >>> import jax.numpy as jnp, meanfield as mf
        >>> q = jnp.array([0.0, 0.0, 1.0])
        >>> mf.theory.drift(q, lambda x: x[0] * x[1]).tolist()
        [0.0, 0.0, -1.0]
    """
    if not callable(log_density):
        raise TypeError(f"log_density must be a callable x -> log rho(x), got {log_density!r}")
    q = jnp.asarray(q)
    if q.ndim != 1 or q.shape[0] < 2:
        raise ValueError(f"q must be one query of shape (d,) with d >= 2, got shape {q.shape}")
    check_finite("q", q)
    g = jax.grad(lambda x: jnp.asarray(log_density(x)).astype(x.dtype))(q)
    d = q.shape[0]
    return g - jnp.dot(q, g) * q - 0.5 * (d - 1) * q
