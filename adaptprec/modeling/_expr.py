"""Parameter expressions (lmfit's ``expr``): ``"2*a"``, ``"w1"``, ``"sqrt(a**2 + b**2)"``.

An expression is Python syntax restricted to numbers, parameter names, ``+ - * / // %
**``, unary signs, parentheses and calls of the functions in :data:`FUNCTIONS` (their
``jax.numpy`` versions, so an expression is differentiable and runs under ``jit``). It is
parsed once (``ast``), every node checked against that list, so evaluating it runs
nothing else: no attributes, subscripts, lambdas or builtins.

Example:
    >>> from adaptprec.modeling._expr import Expression
    >>> e = Expression("2*a + sqrt(b)")
    >>> e.names, float(e({"a": 1.5, "b": 4.0}))
    (('a', 'b'), 5.0)
"""

from __future__ import annotations

import ast

import jax.numpy as jnp

__all__ = ["Expression", "FUNCTIONS", "CONSTANTS"]

#: the functions an expression may call (lmfit's asteval names where they exist)
FUNCTIONS = {name: getattr(jnp, name) for name in (
    "sqrt", "exp", "log", "log10", "log2", "log1p", "expm1", "sin", "cos", "tan",
    "arcsin", "arccos", "arctan", "arctan2", "sinh", "cosh", "tanh", "arcsinh", "arccosh",
    "arctanh", "abs", "sign", "minimum", "maximum", "hypot", "radians", "degrees")}
FUNCTIONS.update(min=jnp.minimum, max=jnp.maximum, fabs=jnp.abs, pow=jnp.power)
#: the constants an expression may name
CONSTANTS = {"pi": jnp.pi, "e": jnp.e, "inf": jnp.inf}

_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Name, ast.Load, ast.Constant,
          ast.Call, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow,
          ast.UAdd, ast.USub)


class Expression:
    """A parsed expression: ``names`` (the names it reads, in order of first use:
    parameters, or :data:`CONSTANTS` unless a parameter has that name) and
    ``__call__(values)`` with ``values`` a mapping from parameter names to numbers or
    arrays. Equal (and hashed) by its text."""

    def __init__(self, text: str):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"an expression must be a non-empty string, got {text!r}")
        self.text = text.strip()
        try:
            tree = ast.parse(self.text, mode="eval")
        except SyntaxError as exc:
            raise ValueError(f"expression {text!r} is not valid: {exc.msg}") from None
        names = []
        for node in ast.walk(tree):
            if not isinstance(node, _NODES):
                raise ValueError(
                    f"expression {text!r} uses {type(node).__name__}: expressions hold "
                    "numbers, parameter names, + - * / ** and the functions "
                    f"{', '.join(sorted(FUNCTIONS))}")
            if isinstance(node, ast.Call):
                if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS \
                        or node.keywords:
                    what = ast.unparse(node.func)
                    raise ValueError(f"expression {text!r} calls {what}: the functions "
                                     f"offered are {', '.join(sorted(FUNCTIONS))}")
            elif isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)):
                raise ValueError(f"expression {text!r} holds {node.value!r}: only numbers")
        called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id not in called and \
                    node.id not in names:
                names.append(node.id)
        self.names = tuple(names)
        self._code = compile(tree, "<expr>", "eval")

    def __call__(self, values):
        scope = dict(FUNCTIONS)
        scope.update(CONSTANTS)
        scope.update({k: values[k] for k in self.names if k in values})
        return eval(self._code, {"__builtins__": {}}, scope)  # noqa: S307 - checked AST

    def __eq__(self, other):
        return isinstance(other, Expression) and other.text == self.text

    def __hash__(self):
        return hash(("Expression", self.text))

    def __repr__(self):
        return f"Expression({self.text!r})"
