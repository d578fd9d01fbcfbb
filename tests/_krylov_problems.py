"""Small test operators shared by the Krylov tests."""

import jax.numpy as jnp


def poisson_matvec(n):
    """5-point Dirichlet Laplacian on an n x n grid, matrix-free (any dtype)."""
    def apply(x):
        u = x.reshape(n, n)
        p = jnp.pad(u, 1)
        return (4 * u - p[:-2, 1:-1] - p[2:, 1:-1] - p[1:-1, :-2] - p[1:-1, 2:]).reshape(-1)
    return apply
