"""``mf.prototypes.train``: runs with equal rates on equally labelled models share one traced
training program (its optimizer is built once per labels and rates), with the numbers of a run
that builds its own optimizer; traced (vmapped) rates still train."""

import jax
import jax.numpy as jnp
import numpy as np

import meanfield as mf
from meanfield import prototypes as P


def _setup():
    x = jax.random.normal(jax.random.key(1), (8, 5, 4))
    traces = []

    def loss(m, xb):
        traces.append(1)  # runs while JAX traces the training program, not when it executes
        return jnp.mean(jax.vmap(lambda s: m.loss_terms(s)[0])(xb))

    def record(m):
        return {"L": loss(m, x)}

    return x, traces, loss, record


def _run(model, loss, x, record, *, eta_P=1e-1, key=2):
    return mf.prototypes.train(
        model,
        loss,
        x,
        key=jax.random.key(key),
        eta_theta=1e-2,
        eta_P=eta_P,
        epochs=2,
        batch_size=4,
        record=record,
    )


def test_equal_rates_share_one_traced_program_with_the_same_numbers():
    x, traces, loss, record = _setup()
    r1 = mf.prototypes.PrototypeReadout(4, 2, 3, 1.0, key=jax.random.key(0))
    r2 = mf.prototypes.PrototypeReadout(
        4, 2, 3, 1.0, key=jax.random.key(5)
    )  # other values, same structure
    _run(r1, loss, x, record)
    after_first = len(traces)
    assert after_first > 0
    m2, h2 = _run(r2, loss, x, record)
    assert len(traces) == after_first, "the second run with equal rates traced the program again"
    _run(r2, loss, x, record, eta_P=0.05)
    assert len(traces) > after_first, "another rate must be another program"
    # the same numbers as a run whose optimizer is built afresh for it
    opt = P.two_timescale_optimizer(r2, 1e-2, 1e-1, optimizer="adam")
    m_ref, h_ref = P._train(r2, opt, loss, x, jax.random.key(2), 2, 4, record)
    np.testing.assert_array_equal(np.asarray(h2["L"]), np.asarray(h_ref["L"]))
    np.testing.assert_array_equal(np.asarray(m2.prototypes), np.asarray(m_ref.prototypes))


def test_vmapped_rates_train_each_rate():
    x, _, loss, record = _setup()
    r = mf.prototypes.PrototypeReadout(4, 2, 3, 1.0, key=jax.random.key(0))
    rates = jnp.asarray([0.05, 0.1])
    batched = jax.vmap(lambda e: _run(r, loss, x, record, eta_P=e)[1]["L"])(rates)
    for i, e in enumerate([0.05, 0.1]):
        np.testing.assert_allclose(
            np.asarray(batched[i]),
            np.asarray(_run(r, loss, x, record, eta_P=e)[1]["L"]),
            rtol=1e-5,
            atol=1e-6,
        )


def test_the_shared_optimizers_stay_bounded():
    r = mf.prototypes.PrototypeReadout(4, 2, 3, 1.0, key=jax.random.key(0))
    for i in range(P._MAX_OPTIMIZERS + 5):
        P._shared_optimizer(r, 1e-2, 1e-3 * (i + 1), "sgd")
    assert 0 < len(P._OPTIMIZERS) <= P._MAX_OPTIMIZERS
