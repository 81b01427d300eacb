"""The density equation with diffusion (``noise=mf.noise.Independent(sigma)``; docs/math/continuum.md,
With noise): the rates lose ``(sigma^2 / 2) l (l + d - 2)``, the fastest mode moves down, the
solver's linear regime follows the rates with diffusion, and common noise is refused."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special

import meanfield as mf
from meanfield import continuum as C

Independent = mf.noise.Independent


def _lap(d, ell):
    ell = np.asarray(ell, np.float64)
    return ell * (ell + d - 2)


def _closed_usa(beta, d, ell):
    """lambda_l of USA from scipy (docs/math/continuum.md, Growth rates)."""
    ell = np.asarray(ell, np.float64)
    if d == 2:
        return ell**2 * scipy.special.iv(ell, beta) / beta
    if d == 3:
        return ell * (ell + 1) * scipy.special.spherical_in(ell.astype(int), beta) / beta
    c = math.gamma(d / 2) * 2 ** (d / 2 - 1) * beta ** (-d / 2)
    return _lap(d, ell) * c * scipy.special.iv(ell + d / 2 - 1, beta)


# ----------------------------------------------------------------------------- dispersion relation


def test_rates_lose_the_laplacian_eigenvalue(x64):
    ells = np.arange(0, 9)
    for d in (2, 3, 5):
        for beta in (0.5, 12.0):
            b = np.float64(beta)
            for model in ("usa", "sa"):
                plain = np.asarray(C.growth_rates(b, d, ells, model=model))
                for s in (0.3, 1.7):
                    got = np.asarray(C.growth_rates(b, d, ells, model=model, noise=Independent(s)))
                    want = plain - s**2 / 2 * _lap(d, ells)
                    # one subtraction: rounding of the larger term
                    scale = np.maximum(np.abs(plain), s**2 / 2 * _lap(d, ells))
                    assert np.all(np.abs(got - want) <= 4e-16 * scale), (d, beta, model, s)
                # sigma = 0 is no noise, bit for bit
                zero = np.asarray(C.growth_rates(b, d, ells, model=model, noise=Independent(0.0)))
                np.testing.assert_array_equal(zero, plain)
            # and against the Bessel closed form itself (usa)
            s = 1.1
            np.testing.assert_allclose(
                C.growth_rates(b, d, ells, noise=Independent(s)),
                _closed_usa(beta, d, ells) - s**2 / 2 * _lap(d, ells),
                rtol=1e-11,
                atol=1e-12 * float(np.max(_closed_usa(beta, d, ells))),
            )


def test_rescaled_rates_are_per_unit_of_the_rescaled_time(x64):
    ells = np.arange(0, 7)
    for d, beta, s in ((2, 5.0, 0.8), (3, 30.0, 1e5)):  # the diffusion stabilises the upper degrees
        b = np.float64(beta)
        orig = np.asarray(C.growth_rates(b, d, ells, noise=Independent(s)))
        resc = np.asarray(C.growth_rates(b, d, ells, rescaled=True, noise=Independent(s)))
        np.testing.assert_allclose(resc, np.exp(-beta) * orig, rtol=1e-12, atol=1e-14)
        assert orig[1] > 0 > orig[-1]
    # large beta stays finite, and a diffusion D e^{-beta} below float32's normal range is kept
    # (e^{-beta} is applied as two halves: e^{-100} alone flushes to 0 in float32)
    big = np.asarray(
        C.growth_rates(
            np.float32(2000.0), 3, jnp.arange(1, 100), rescaled=True, noise=Independent(1.0)
        )
    )
    assert big.dtype == np.float32 and np.all(np.isfinite(big)) and np.all(big > 0)
    got = C.growth_rates(np.float32(100.0), 3, [1, 2, 3], rescaled=True, noise=Independent(1e19))
    assert got.dtype == jnp.float32
    plain = np.asarray(C.growth_rates(np.float64(100.0), 3, [1, 2, 3], rescaled=True))
    want = plain - np.exp(2 * np.log(1e19) - np.log(2.0) - 100.0) * _lap(3, [1, 2, 3])
    assert np.all(want < 0.97 * plain)  # the diffusion is a few percent of the rate
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_vmap_and_grad_over_sigma(x64):
    ells = jnp.arange(0, 6)
    sigmas = jnp.array([0.0, 0.5, 2.0])
    f = lambda s: C.growth_rates(jnp.float64(4.0), 3, ells, noise=Independent(s))  # noqa: E731
    batched = jax.vmap(f)(sigmas)
    for i, s in enumerate(np.asarray(sigmas)):
        np.testing.assert_array_equal(batched[i], f(float(s)))
    lap = _lap(3, 2)
    for rescaled, factor in ((False, 1.0), (True, math.exp(-4.0))):
        g = jax.grad(
            lambda s, r=rescaled: C.growth_rates(
                jnp.float64(4.0), 3, 2, rescaled=r, noise=Independent(s)
            )
        )
        for s in (0.0, 0.7, 3.0):  # d rate / d sigma = -sigma l (l + d - 2) (e^{-beta} rescaled)
            assert float(g(s)) == pytest.approx(-s * lap * factor, rel=1e-15, abs=0.0)
    # jit over a traced sigma and beta together
    h = jax.jit(lambda b, s: C.growth_rates(b, 2, 3, noise=Independent(s)))
    assert float(h(4.0, 1.0)) == pytest.approx(float(_closed_usa(4.0, 2, 3)) - 4.5, rel=1e-12)


class CubicNoiseKernel(mf.kernels.Kernel):
    """``h(t) = beta (t^2 + t^3)`` (tests/test_continuum_profile.py's Cubic): quadrature rates."""

    name = "cubic-noise-test"
    beta: float = mf.kernels.param(1.0, kind="float>0", doc="scale of the cubic profile")

    def __call__(self, x, xi, y, zeta):
        t = jnp.dot(x, y)
        return self.beta * (t**2 + t**3)

    @classmethod
    def zonal_profile(cls, rescaled=False):
        return _Cubic()


class _Cubic(mf.kernels.Profile):
    def values(self, t, beta):
        return beta * (t**2 + t**3)


def test_quadrature_profile_rates_with_noise(x64):
    # closed form at beta = 1, degrees 0..4 (tests/test_continuum_profile.py): rho_0 l (l + d - 2) mu_l
    cubic = {
        2: np.array([0.0, 3 / 8, 1.0, 9 / 8, 0.0]),
        3: np.array([0.0, 2 / 5, 4 / 5, 24 / 35, 0.0]),
    }
    mf.kernels.register(CubicNoiseKernel)
    try:
        for d, rates in cubic.items():
            s = 0.6
            got = C.growth_rates(
                np.float64(1.0), d, np.arange(5), model="cubic-noise-test", noise=Independent(s)
            )
            np.testing.assert_allclose(
                got, rates - s**2 / 2 * _lap(d, np.arange(5)), rtol=1e-12, atol=1e-14
            )
            # D = 0.18 on S^1: rates - 0.18 k^2 = [0, 0.195, 0.28, -0.495, -2.88]: degree 2 is fastest
            mode = C.most_unstable_mode(
                1.0, d, model="cubic-noise-test", max_mode=4, noise=Independent(s)
            )
            assert int(mode) == int(np.argmax((rates - s**2 / 2 * _lap(d, np.arange(5)))[1:])) + 1
    finally:
        mf.kernels.unregister(CubicNoiseKernel.name)


def test_most_unstable_mode_moves_down_with_noise():
    def brute(beta, d, D):
        ells = np.arange(1, 100)  # past the default search's 4 ceil(sqrt(2 beta)) + 8 = 44
        return int(ells[np.argmax(_closed_usa(beta, d, ells) - D * _lap(d, ells))])

    for d, beta in ((2, 9.0), (3, 40.0)):
        lam = _closed_usa(beta, d, np.arange(1, 100))
        l0 = int(np.argmax(lam)) + 1
        d_crit = lam[0] / (d - 1)  # stable from here on (docs/math/continuum.md, With noise)
        modes = []
        for D in (0.0, 0.05 * d_crit, 0.3 * d_crit, 0.99 * d_crit, 1.01 * d_crit):
            s = math.sqrt(2 * D)
            got = int(C.most_unstable_mode(beta, d, noise=Independent(s)))
            assert got == brute(beta, d, D), (d, beta, D)
            assert got == int(C.most_unstable_mode(beta, d, max_mode=64, noise=Independent(s)))
            rate = float(C.growth_rates(beta, d, got, rescaled=True, noise=Independent(s)))
            assert (rate > 0) == (D < d_crit)  # stable exactly past lambda_1 / (d - 1)
            modes.append(got)
        assert modes[0] == l0 > 1 and modes[-1] == 1 and modes == sorted(modes, reverse=True)
    # a traced sigma (vmap) on the grid of degrees
    sig = jnp.array([0.0, 2.0, 4.0])
    got = jax.vmap(lambda s: C.most_unstable_mode(9.0, 2, max_mode=32, noise=Independent(s)))(sig)
    assert [int(v) for v in got] == [brute(9.0, 2, float(s) ** 2 / 2) for s in sig]


# ----------------------------------------------------------------------------- solver


@pytest.mark.parametrize("d, L, ell", [(2, 12, 3), (3, 8, 3)])
def test_linear_regime_decays_at_the_rate_with_diffusion(x64, d, L, ell):
    """A mode perturbation of amplitude 1e-5 grows at lambda_l - D l (l + d - 2), D = 0, lambda/2,
    3 lambda/2 (per unit l (l + d - 2)): the last one decays. Odd ``ell``: the quadratic terms feed
    degrees 0 and 2 ell (and, on S^2, only even degrees from P_ell^2), so the correction to degree
    ``ell`` is cubic, relative (1e-5 e)^2 ~ 1e-9 over the run; the time integration (rtol 1e-10,
    atol 1e-14 against coefficients ~1e-6) adds about 1e-8 to log a(t); the rates are ~4 and the
    slope is fitted over t1 = 1 / lambda: allowed error 1e-6 (measured 2e-8)."""
    beta = 4.0
    g = C.grid(d, L, dtype=jnp.float64)
    lam = float(_closed_usa(beta, d, ell))
    lap = float(_lap(d, ell))
    sigmas = jnp.sqrt(
        jnp.array([0.0, lam / lap, 3 * lam / lap])
    )  # D = 0, lam / (2 lap), 3 lam / (2 lap)
    ts = jnp.linspace(0.0, 1.0 / lam, 5)
    rho0 = C.mode_perturbation(g, ell, 1e-5)

    def run(s):
        sol = C.solve(
            beta, rho0, d=d, t1=ts[-1], ts=ts, noise=Independent(s), rtol=1e-10, atol=1e-14
        )
        amp = jax.vmap(lambda r: C.mode_amplitude(r, d, ell))(sol.densities)
        return amp, sol.mass, sol.status

    amp, mass, status = jax.jit(jax.vmap(run))(sigmas)  # one program for the three sigmas
    assert np.all(np.asarray(status) == C.OK)
    slopes = [np.polyfit(np.asarray(ts), np.log(np.asarray(a)), 1)[0] for a in amp]
    want = [
        float(C.growth_rates(np.float64(beta), d, ell, noise=Independent(float(s)))) for s in sigmas
    ]
    np.testing.assert_allclose(want, [lam, lam / 2, -lam / 2], rtol=1e-12)
    np.testing.assert_allclose(slopes, want, rtol=0, atol=1e-6)
    assert slopes[0] > 0 > slopes[2]  # noise turns the unstable mode into a decaying one
    # the mass is conserved to rounding with diffusion (degree 0 has the Laplacian's eigenvalue 0)
    assert np.max(np.abs(np.asarray(mass) - 1)) < 1e-13


def test_rescaled_solver_with_noise(x64):
    """Rescaled time s = e^beta t: the diffusion is D e^{-beta} per unit of s; the linear slope is
    e^{-beta} (lambda - D k^2), negative here (tolerance as above, relative to the rate)."""
    beta, k = 4.0, 2
    g = C.grid(2, 12, dtype=jnp.float64)
    s = 3.0  # D k^2 = 18 > lambda_2 = 6.4
    want = float(C.growth_rates(np.float64(beta), 2, k, rescaled=True, noise=Independent(s)))
    assert want == pytest.approx(
        math.exp(-beta) * (float(_closed_usa(beta, 2, k)) - 18.0), rel=1e-12
    )
    ts = np.linspace(0.0, 1.0 / abs(want), 5)
    sol = C.solve(
        beta,
        C.mode_perturbation(g, k, 1e-5),
        d=2,
        t1=ts[-1],
        ts=ts,
        rescaled=True,
        noise=Independent(s),
        rtol=1e-10,
        atol=1e-14,
    )
    amp = np.asarray(jax.vmap(lambda r: C.mode_amplitude(r, 2, k))(sol.densities))
    slope = np.polyfit(ts, np.log(amp), 1)[0]
    assert slope == pytest.approx(want, rel=1e-6)


# ----------------------------------------------------------------------------- refusals


def test_common_noise_and_other_values_are_refused():
    g = C.grid(2, 8)
    rho = C.mode_perturbation(g, 1, 0.1)
    calls = (
        lambda noise: C.growth_rates(1.0, 2, 1, noise=noise),
        lambda noise: C.most_unstable_mode(1.0, 2, noise=noise),
        lambda noise: C.solve(1.0, rho, d=2, t1=0.1, noise=noise),
    )
    for call in calls:
        with pytest.raises(
            ValueError, match=r"noise='common' .*stochastic PDE.*no deterministic Fokker-Planck"
        ):
            call(mf.noise.Common(0.2))
        for bad in ("independent", 0.5):
            with pytest.raises(
                TypeError, match=rf"noise must be None or .*Independent\(sigma\).*got {bad!r}"
            ):
                call(bad)
    # a negative or non-finite sigma is the noise's own refusal
    with pytest.raises(ValueError, match="sigma must be >= 0"):
        Independent(-0.1)
    with pytest.raises(ValueError, match="sigma must be finite"):
        Independent(float("inf"))
