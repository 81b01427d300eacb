"""A model's zonal profile (``Model.zonal_profile``, ``mf.kernels.Profile``) drives ``mf.continuum``:
a model class defined here, registered for the test, runs through the dispersion relation and the
density solver with the numbers its profile's Funk-Hecke eigenvalues give in closed form."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield import continuum as C


class Cubic(mf.kernels.Profile):
    """``h(t) = beta (t^2 + t^3)``: on S^1 ``cos^2 = (1 + cos 2 phi) / 2``, ``cos^3 = (3 cos phi +
    cos 3 phi) / 4``; on S^2 ``t^2 = (2 P_2 + 1) / 3``, ``t^3 = (2 P_3 + 3 P_1) / 5``."""

    def values(self, t, beta):
        return beta * (t**2 + t**3)


class ScaledExp(mf.kernels.Profile):
    """``c e^{beta (t - 1)}`` (``c = 2``, any normalisation): not an ``ExpProfile``, so quadrature."""

    scale: float = 2.0

    def values(self, t, beta):
        return self.scale * jnp.exp(beta * (jnp.asarray(t) - 1))


class CubicKernel(mf.kernels.Kernel):
    name = "cubic-profile-test"
    beta: float = mf.kernels.param(1.0, kind="float>0", doc="scale of the cubic profile")

    def __call__(self, x, xi, y, zeta):
        t = jnp.dot(x, y)
        return self.beta * (t**2 + t**3)

    @classmethod
    def zonal_profile(cls, rescaled=False):
        return Cubic()


class SoftmaxTwice(mf.kernels.Kernel):
    name = "softmax-twice-test"
    beta: float = mf.kernels.param(1.0, kind="float>0", doc="inverse temperature")

    def __call__(self, x, xi, y, zeta):
        return 2 * jnp.exp(self.beta * (jnp.dot(x, y) - 1))

    @classmethod
    def zonal_profile(cls, rescaled=False):
        return ScaledExp(normalized=True)


@pytest.fixture
def registered():
    for cls in (CubicKernel, SoftmaxTwice):
        mf.kernels.register(cls)
    yield
    for cls in (CubicKernel, SoftmaxTwice):
        mf.kernels.unregister(cls.name)


#: rates of h = beta (t^2 + t^3) at beta = 1, degrees 0..4: rho_0 l (l + d - 2) mu_l
CUBIC_RATES = {2: [0.0, 3 / 8, 1.0, 9 / 8, 0.0], 3: [0.0, 2 / 5, 4 / 5, 24 / 35, 0.0]}


def test_zonal_models_lists_the_registered_profiles(registered):
    assert C.zonal_models()[:2] == ("usa", "sa")
    assert {"cubic-profile-test", "softmax-twice-test"} <= set(C.zonal_models())
    assert C.model_profile("cubic-profile-test") == Cubic()


def test_models_without_a_profile_are_one_error_listing_those_with_one():
    assert mf.kernels.RoPE.zonal_profile() is None
    assert mf.kernels.DistanceBias.zonal_profile() is None
    with pytest.raises(ValueError, match=r"model 'rope' has no zonal profile.*'usa', 'sa'"):
        C.growth_rates(1.0, 2, [1, 2], model="rope")
    with pytest.raises(ValueError, match=r"unknown model 'nope'; accepted: 'usa', 'sa'"):
        C.solve(1.0, C.mode_perturbation(C.grid(2, 8), 1, 0.1), d=2, t1=0.1, model="nope")


@pytest.mark.parametrize("d", [2, 3])
def test_growth_rates_of_a_polynomial_profile_are_its_funk_hecke_eigenvalues(registered, x64, d):
    for beta in (1.0, 2.5):
        got = C.growth_rates(beta, d, np.arange(5), model="cubic-profile-test")
        np.testing.assert_allclose(got, beta * np.asarray(CUBIC_RATES[d]), rtol=1e-12, atol=1e-10)
    # a batch of betas broadcast against the degrees, under jit and vmap
    betas = jnp.asarray([1.0, 2.0])
    jitted = jax.jit(
        lambda b: C.growth_rates(b[:, None], d, np.arange(5), model="cubic-profile-test")
    )
    np.testing.assert_allclose(
        jitted(betas), betas[:, None] * np.asarray(CUBIC_RATES[d]), rtol=1e-12, atol=1e-10
    )


@pytest.mark.parametrize("d", [2, 3])
def test_solver_multipliers_of_a_polynomial_profile(x64, d):
    mu = C._multipliers(jnp.asarray(1.0), d, 6, Cubic(), False, jnp.float64)
    rates = np.arange(6) * (np.arange(6) + d - 2) * C.uniform_density(d) * np.asarray(mu)
    np.testing.assert_allclose(rates[:5], CUBIC_RATES[d], atol=1e-12)


@pytest.mark.parametrize("d", [2, 3, 5])
def test_quadrature_rates_of_another_normalisation_match_the_closed_form(registered, x64, d):
    """A normalised profile is invariant under a constant factor: ``2 e^{beta (t - 1)}`` by quadrature
    has the Bessel rates of ``"sa"``."""
    ell = np.arange(12)
    for beta in (0.5, 4.0, 20.0):
        got = C.growth_rates(beta, d, ell, model="softmax-twice-test")
        want = C.growth_rates(beta, d, ell, model="sa")
        # quadrature: the rounding of mu_0's size in every mu_l (absolute, not relative, error)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12 * float(np.max(want)))


def test_solve_grows_the_mode_at_the_profile_s_rate(registered, x64):
    g = C.grid(2, 8, dtype=jnp.float64)
    eps, t1 = 1e-6, 0.5
    sol = C.solve(
        1.0,
        C.mode_perturbation(g, 2, eps),
        d=2,
        t1=t1,
        model="cubic-profile-test",
        rtol=1e-10,
        atol=1e-12,
    )
    assert sol.status_name() == "ok"
    a = C.mode_amplitude(sol.densities[-1], 2, 2)
    np.testing.assert_allclose(float(np.log(a / eps) / t1), 1.0, rtol=1e-4)


def test_profiles_without_closed_form_need_concrete_degrees_and_max_mode(registered):
    with pytest.raises(ValueError, match="no closed-form rates.*concrete degrees"):
        jax.jit(lambda e: C.growth_rates(1.0, 2, e, model="cubic-profile-test"))(jnp.arange(3))
    with pytest.raises(ValueError, match="no closed-form rates: pass max_mode"):
        C.most_unstable_mode(1.0, 2, model="cubic-profile-test")
    assert int(C.most_unstable_mode(1.0, 2, model="cubic-profile-test", max_mode=6)) == 3
    with pytest.raises(
        ValueError, match="rescaled=True applies to model='usa' only: 'cubic-profile-test' has no"
    ):
        C.growth_rates(1.0, 2, [1], model="cubic-profile-test", rescaled=True)
