"""Inverse p-th roots of symmetric positive semi-definite matrices, for Shampoo (and the
eigenbases SOAP uses, ``eigenbasis``).

``inverse_pth_root`` computes ``(A + ridge I)^(-1/p)`` with ``ridge = ridge_epsilon * lambda_max``
(``lambda_max`` from power iteration) by the coupled Newton iteration of Guo & Higham (2006):

    X_0 = z^(1/p) I,  M_0 = z A,  z = 1 / lambda_max
    T_k = ((p + 1) I - M_k) / p,  X_{k+1} = X_k T_k,  M_{k+1} = T_k^p M_k

which keeps ``M_k = X_k^p A`` and drives ``M_k -> I``, so ``X_k -> A^(-1/p)``. With ``z`` scaling
the spectrum of ``M_0`` into ``(0, 1]`` every eigenvalue rises monotonically to 1. The iteration
stops when ``max|M - I|`` (the error estimate) falls under ``tolerance`` or stops decreasing; the
best iterate is returned with its error. A root *fails* when the result is not finite or the
error is above ``error_threshold``; callers keep their previous root then. An all-zero matrix
carries no information: its root is reported as not updated (also not a failure).

``inverse_pth_root_eigh`` is the eigendecomposition path, for comparison. Both run under
``jax.jit``/``vmap``; matmuls use ``Precision.HIGHEST`` (on TPU the default is bf16 passes).

Attainable accuracy: the input's float32 rounding alone perturbs eigenvalue ``lambda`` by about
``1e-7 * lambda_max``, so for condition numbers near 1e6 the smallest directions of any float32
root carry errors of order 1e-3 (coupled Newton is about 10x better than float32 ``eigh``). The
asynchronous host path can compute in float64, which removes this limit.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

_HIGHEST = lax.Precision.HIGHEST


class SolveResult(NamedTuple):
    """A matrix computed from one statistic: an inverse root, or an eigenbasis."""

    matrix: jax.Array  # [n, n]
    error: jax.Array  # scalar: max|X^p A - I| estimate (0 for the eigh path and eigenbases)
    ok: jax.Array  # bool scalar: finite, converged and below the error threshold
    updated: jax.Array  # bool scalar: False for an all-zero matrix (nothing to compute)


def _mm(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.matmul(a, b, precision=_HIGHEST)


def _matrix_power(m: jax.Array, p: int) -> jax.Array:
    """``m**p`` for a static positive integer ``p`` by repeated squaring."""
    result, base = None, m
    while p:
        if p & 1:
            result = base if result is None else _mm(result, base)
        p >>= 1
        if p:
            base = _mm(base, base)
    return result


def max_eigenvalue(a: jax.Array, num_iterations: int = 64) -> jax.Array:
    """Largest eigenvalue of a symmetric PSD matrix by power iteration (Rayleigh quotient)."""
    # A fixed, irregular start vector (no RNG: cheaper to compile, reproducible).
    v = jnp.cos(jnp.arange(a.shape[-1], dtype=a.dtype) * 2.399963) + 1.25

    def step(_, v):
        w = _mm(a, v)
        return w / jnp.maximum(jnp.linalg.norm(w), jnp.finfo(a.dtype).tiny)

    v = lax.fori_loop(0, num_iterations, step, v / jnp.linalg.norm(v))
    return jnp.vdot(v, _mm(a, v))


def _ridged(a: jax.Array, ridge_epsilon: float) -> tuple[jax.Array, jax.Array]:
    """``a + ridge_epsilon * lambda_max * I`` and its largest eigenvalue."""
    lam = max_eigenvalue(a)
    ridge = ridge_epsilon * lam
    return a + ridge * jnp.eye(a.shape[-1], dtype=a.dtype), lam + ridge


def inverse_pth_root(
    a: jax.Array,
    p: int,
    *,
    ridge_epsilon: float = 1e-6,
    max_iterations: int = 100,
    tolerance: float = 1e-6,
    error_threshold: float = 1e-2,
) -> SolveResult:
    """``(a + ridge_epsilon * lambda_max(a) * I)^(-1/p)`` by coupled Newton iteration."""
    eye = jnp.eye(a.shape[-1], dtype=a.dtype)
    a, lam = _ridged(a, ridge_epsilon)
    updated = lam != 0  # NaN counts as updated, so that it fails (and is counted)
    z = 1.0 / jnp.where(updated, lam, 1.0)
    x, m = z ** (1.0 / p) * eye, z * a
    error = jnp.max(jnp.abs(m - eye))

    def keep_going(carry):
        i, _, _, _, improving = carry
        return (i < max_iterations) & improving

    def newton_step(carry):
        i, x, m, error, _ = carry
        t = ((p + 1) * eye - m) / p
        x_next, m_next = _mm(x, t), _mm(_matrix_power(t, p), m)
        error_next = jnp.max(jnp.abs(m_next - eye))
        better = error_next < error
        x, m = jnp.where(better, x_next, x), jnp.where(better, m_next, m)
        return i + 1, x, m, jnp.minimum(error, error_next), better & (error_next > tolerance)

    carry = (0, x, m, error, error > tolerance)
    _, x, _, error, _ = lax.while_loop(keep_going, newton_step, carry)
    x = 0.5 * (x + x.T)
    ok = updated & jnp.all(jnp.isfinite(x)) & (error <= error_threshold)
    return SolveResult(x, error, ok, updated)


def inverse_pth_root_eigh(a: jax.Array, p: int, *, ridge_epsilon: float = 1e-6) -> SolveResult:
    """The same root from an eigendecomposition (``jnp.linalg.eigh``), for comparison."""
    a, lam = _ridged(a, ridge_epsilon)
    updated = lam != 0  # NaN counts as updated, so that it fails (and is counted)
    w, q = jnp.linalg.eigh(a)
    w = jnp.maximum(w, ridge_epsilon * lam)
    root = _mm(q * w ** (-1.0 / p), q.T)
    ok = updated & jnp.all(jnp.isfinite(root))
    return SolveResult(root, jnp.zeros((), a.dtype), ok, updated)


def eigenbasis(a: jax.Array) -> SolveResult:
    """The eigenvectors of symmetric ``a`` as columns, by decreasing eigenvalue (SOAP's basis).

    An all-zero ``a`` has no basis to offer: not updated (the identity in use stays).
    """
    updated = jnp.any(a != 0)  # NaN counts as updated, so that it fails (and is counted)
    _, q = jnp.linalg.eigh(a)
    basis = q[:, ::-1]
    ok = updated & jnp.all(jnp.isfinite(basis))
    return SolveResult(basis, jnp.zeros((), a.dtype), ok, updated)
