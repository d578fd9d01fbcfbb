"""Issue 34's papercuts: each test fails without its fix.

1. solve_nlsq_batch with non-numeric data says so, as curve_fit does.
2. A user function that returns a non-array is named in the error (not adaptprec's lambda).
3. The profile CLI without matplotlib: exit 2 with one ``error:`` line.
4. The API reference: constants have docstrings; curve_fit/explain entries are functions.
5. The profile plot: labels that do not overlap, a title naming the profiled kernel.
"""

import sys

import jax.numpy as jnp
import numpy as np
import pytest

import adaptprec as ap

from _subprocess import run_python

TT = np.linspace(0.0, 3.0, 30)
Y = np.ones((10, 30))


def decay(p, t):
    return p[0] * jnp.exp(-p[1] * t)


# ------------------------------------------------------------------ 1. batch input dtypes

BATCH_CASES = [
    ("ydata", dict(args=(TT,), ydata=[["x"] * 30] * 10), "ydata must be numbers, got dtype <U1"),
    ("sigma", dict(args=(TT,), ydata=Y, sigma=["x"] * 30), "sigma must be numbers, got dtype <U1"),
    ("shared arg", dict(args=(["x"] * 30,), ydata=Y), r"args\[0\] must be numbers, got dtype <U1"),
    ("shared arg array", dict(args=(np.array(["x"] * 30),), ydata=Y),
     r"args\[0\] must be numbers, got dtype <U1"),
    ("batched arg", dict(args=([["x"] * 30] * 10,), in_axes=0, ydata=Y),
     r"args\[0\] must be numbers, got dtype <U1"),
    ("string arg", dict(args=("fast",), ydata=Y), r"args\[0\] must be numbers, got the string"),
    ("bounds", dict(args=(TT,), ydata=Y, bounds=(["a", "b"], [3.0, 3.0])),
     "lower bound must be numbers, got dtype <U1"),
]


@pytest.mark.parametrize("kw,msg", [c[1:] for c in BATCH_CASES], ids=[c[0] for c in BATCH_CASES])
def test_batch_non_numeric_inputs_are_named(kw, msg):
    kw = dict(kw)
    args = kw.pop("args")
    kw.setdefault("in_axes", None)
    with pytest.raises(ValueError, match=msg):
        ap.solve_nlsq_batch(decay, np.ones((10, 2)), args, **kw)


def test_batch_ydata_message_is_curve_fits():
    with pytest.raises(ValueError) as batch:
        ap.solve_nlsq_batch(decay, np.ones((10, 2)), (TT,), in_axes=None,
                            ydata=[["x"] * 30] * 10)
    with pytest.raises(ValueError) as single:
        ap.curve_fit(lambda t, a, k: a * jnp.exp(-k * t), TT, ["x"] * 30)
    assert str(batch.value) == str(single.value)


# ------------------------------------------------------------- 2. the user's function named

def returns_a_string(p, t):
    return "oops"


def test_batch_names_the_users_model():
    with pytest.raises(TypeError, match=r"model returns_a_string \(.*test_papercuts.py:\d+\) "
                       r"must return an array.*returned the str 'oops'.*Fix: "):
        ap.solve_nlsq_batch(returns_a_string, np.ones((10, 2)), (TT,), in_axes=None,
                            ydata=Y)


def test_batch_names_the_users_residual_returning_none():
    with pytest.raises(TypeError, match=r"residual .*<lambda>.*returned None"):
        ap.solve_nlsq_batch(lambda p, t: None, np.ones((10, 2)), (TT,), in_axes=None)


def test_profile_names_the_profiled_function():
    def kernel(x):
        return "oops"

    with pytest.raises(TypeError, match=r"profiled function .*kernel \(.*test_papercuts"
                       r".py:\d+\) must return an array.*the str 'oops'"):
        ap.profile(kernel, jnp.ones(3), configs=["f32"])


def test_returns_arrays_accepts_arrays_numbers_and_pytrees():
    from adaptprec._user_fn import returns_arrays

    for out in (jnp.ones(2), np.ones(2), 1.0, np.float32(1), {"a": jnp.ones(1)}, [1.0, 2.0]):
        assert returns_arrays(decay, out) is out
    for out in ("x", None, {"a": "x"}, [], np.array(["a"]), object()):
        with pytest.raises(TypeError, match="decay"):
            returns_arrays(decay, out)


def test_solve_nlsq_names_the_users_residual():
    def residual(p):
        return "oops"

    with pytest.raises(TypeError, match=r"residual .*residual \(.*test_papercuts.py:\d+\)"):
        ap.solve_nlsq(residual, jnp.array([2.0]))


def test_curve_fit_names_the_users_model():
    def model(t, a):
        return "oops"

    with pytest.raises(TypeError, match=r"model .*model \(.*test_papercuts.py:\d+\)"):
        ap.curve_fit(model, TT, np.ones(30), p0=[1.0])


# ------------------------------------------------------------ 3. CLI --plot, no matplotlib

KERNEL_FILE = """
import jax.numpy as jnp

def dot_kernel(x):
    return jnp.sum(x * x)

def setup():
    return dot_kernel, (jnp.linspace(0.0, 1.0, 64),)
"""


def test_cli_plot_without_matplotlib_exits_2_with_one_error_line(tmp_path):
    (tmp_path / "kernels.py").write_text(KERNEL_FILE)
    out = run_python(f"""
        import sys
        sys.modules["matplotlib"] = None          # as if matplotlib were not installed
        from adaptprec.cli import main
        sys.exit(main(["profile", {str(tmp_path / 'kernels.py')!r} + ":setup",
                       "--configs", "f32", "--repeats", "1",
                       "--plot", {str(tmp_path / 'out.png')!r}]))
        """, x64=False, timeout=300)
    assert out.returncode == 2, (out.stdout, out.stderr[-2000:])
    err = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: "), out.stderr[-2000:]
    assert "matplotlib" in err[0] and "pip install" in err[0]
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "out.png").exists()


# ------------------------------------------------------ 5. the profile plot's labels

def _text_boxes(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    ticks = {id(t) for ax in fig.axes for t in ax.get_xticklabels(which="both")
             + ax.get_yticklabels(which="both")}      # (matplotlib's own layout)
    return [(t.get_text(), t.get_window_extent(renderer)) for t in fig.findobj(Text)
            if t.get_visible() and t.get_text().strip() and id(t) not in ticks]


def test_profile_plot_labels_do_not_overlap():
    pytest.importorskip("matplotlib")
    from adaptprec._profile import Profile, ProfileRow

    def row(name, rung, t, digits):
        return ProfileRow(name, "dtype", rung, 0.1, t, [t], 1, 1, 0, 10 ** -digits,
                          10 ** -digits, digits)

    # f32 and auto_mixed_bf16 at nearly the same time and digits, as in the issue
    prof = Profile("softmax_kernel", "f64", [
        row("bf16", "bf16", 9.0e-5, 2.3), row("f32", "f32", 1.30e-4, 7.1),
        row("f64", "f64", 1.5e-4, 16.0), row("bf16,f32,f64", "bf16", 3.2e-4, 2.3),
        row("auto_mixed_bf16", "autocast bf16", 1.29e-4, 7.1)])
    boxes = _text_boxes(prof.plot())
    texts = [t for t, _ in boxes]
    assert "f32" in texts and "auto_mixed_bf16 -> autocast bf16" in texts
    overlaps = [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:]
                if ba.overlaps(bb)]
    assert not overlaps, overlaps


@pytest.mark.slow
def test_cli_profile_title_names_the_kernel(tmp_path):
    (tmp_path / "kernels.py").write_text(KERNEL_FILE)
    out = run_python(f"""
        import sys
        from adaptprec import cli
        import adaptprec._profile as P
        real = P.Profile.plot
        def plot(self, ax=None):
            fig = real(self, ax)
            print("TITLE", fig.axes[0].get_title())
            return fig
        P.Profile.plot = plot
        sys.exit(cli.main(["profile", {str(tmp_path / 'kernels.py')!r} + ":setup",
                           "--configs", "f32", "--repeats", "1",
                           "--plot", {str(tmp_path / 'out.png')!r}]))
        """, x64=False, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    title = [ln for ln in out.stdout.splitlines() if ln.startswith("TITLE ")]
    assert title and "dot_kernel" in title[0], out.stdout


# ------------------------------------------------ 4. the API reference's entries

_NLSQ_CONSTANTS = {"adaptprec.nlsq.common.STATUS_MESSAGES", "adaptprec.nlsq.common.LOSSES",
                   "adaptprec.nlsq.result.ESCALATION_REASONS"}


def _reference_objects():
    """Every ``::: path`` entry of the API page, loaded as mkdocstrings loads it (griffe,
    with the site's extensions)."""
    import importlib.util
    import pathlib
    import re

    griffe = pytest.importorskip("griffe")
    root = pathlib.Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("docs_hooks", root / "tools" / "docs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    paths = re.findall(r"^::: ([\w.]+)\s*$", hooks.reference(), flags=re.M)
    # the griffe extensions the site uses (mkdocs.yml), from the checkout
    names = re.findall(r"^\s*- (tools/[\w/]+\.py:\w+)\s*$",
                       (root / "mkdocs.yml").read_text(), flags=re.M)
    ext = griffe.load_extensions(*(str(root / n) for n in names))
    loader = griffe.GriffeLoader(search_paths=[str(root)], extensions=ext)
    loader.load("adaptprec")
    loader.resolve_aliases(implicit=False, external=False)
    return {p: loader.modules_collection.get_member(p) for p in paths}


@pytest.fixture(scope="module")
def reference_objects():
    return _reference_objects()


def test_every_api_entry_has_a_docstring(reference_objects):
    empty = [p for p, obj in reference_objects.items()
             if p not in _NLSQ_CONSTANTS and not (obj.docstring and obj.docstring.value.strip())]
    assert not empty, f"API entries without a docstring: {empty}"


def test_nlsq_constants_have_docstrings(reference_objects):
    empty = [p for p in sorted(_NLSQ_CONSTANTS) if not reference_objects[p].docstring]
    assert not empty, empty


def test_shadowed_functions_are_documented_as_functions(reference_objects):
    for name in ("curve_fit", "explain"):
        obj = reference_objects[f"adaptprec.{name}"]
        assert obj.is_function, (name, obj.kind)
        assert obj.final_target.path.endswith(f".{name}.{name}"), obj.final_target.path
    # no top-level entry documents a module other than the public modules
    modules = [p for p, obj in reference_objects.items()
               if p.count(".") == 1 and obj.is_module]
    assert sorted(modules) == ["adaptprec.guards", "adaptprec.linalg", "adaptprec.nlsq",
                               "adaptprec.schedule"], modules


# ------------------------------------------- rank-deficient linalg.solve: not a certificate

# row 0 + row 1 = row 2, b inconsistent: LU finds a tiny (not zero) pivot in float64
RANK_DEFICIENT = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.5, 0.7, 0.9]])
INCONSISTENT_B = np.array([1.0, 2.0, 4.0])


@pytest.mark.slow
def test_rank_deficient_solve_info_is_not_a_certificate():
    A, b = jnp.asarray(RANK_DEFICIENT), jnp.asarray(INCONSISTENT_B)
    x, info = ap.linalg.solve(A, b)
    xn = np.asarray(x)
    true_rel = np.max(np.abs(INCONSISTENT_B - RANK_DEFICIENT @ xn)) / np.max(
        np.abs(INCONSISTENT_B))
    assert np.all(np.isfinite(xn)) and np.max(np.abs(xn)) > 1e12
    assert float(info.backward_error) < 1e-14            # small: x is huge
    assert ap.Status(int(info.status)) == ap.Status.ILL_CONDITIONED
    np.testing.assert_allclose(float(info.residual_norm), true_rel, rtol=1e-6)
    assert float(info.residual_norm) > 1e-2 and bool(info.huge_x)
    assert "small only because ||x|| is huge" in repr(info)
    assert "small only because ||x|| is huge" in info.message


@pytest.mark.slow
def test_well_posed_solve_info_has_no_note():
    A = jnp.asarray(np.random.default_rng(0).standard_normal((6, 6))) + 4 * jnp.eye(6)
    x, info = ap.linalg.solve(A, jnp.ones(6))
    assert float(info.residual_norm) < 1e-14 and not bool(info.huge_x)
    assert "huge" not in repr(info) and "huge" not in info.message
    # an inconsistent least-squares problem has a residual, and that is no warning
    _, linfo = ap.linalg.lstsq(jnp.asarray(np.random.default_rng(1).standard_normal((8, 3))),
                               jnp.ones(8))
    assert float(linfo.residual_norm) > 0.1 and not bool(linfo.huge_x)
    assert "huge" not in repr(linfo)


@pytest.mark.slow
def test_residual_norm_under_jit_and_vmap():
    import jax

    As = jnp.stack([jnp.asarray(RANK_DEFICIENT), jnp.eye(3)])
    bs = jnp.stack([jnp.asarray(INCONSISTENT_B)] * 2)
    _, info = jax.jit(jax.vmap(ap.linalg.solve))(As, bs)
    assert info.residual_norm.shape == (2,)
    assert np.asarray(info.huge_x).tolist() == [True, False]
    assert "system(s) [[0]]" in repr(info)
