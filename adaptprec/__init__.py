"""adaptprec: adaptive-precision numerics on JAX.

Run kernels in a cheap precision, check inside ``jit`` whether the answer can be trusted,
and escalate bf16 -> f32 -> f64 only when it cannot.

Example:
    >>> import adaptprec as ap
    >>> str(ap.Ladder.parse("bf16,f32"))
    'bf16,f32'
    >>> str(ap.Policy.parse("c=bf16"))
    'p=f32,c=bf16,o=bf16'
"""

from typing import TYPE_CHECKING

from .precision import (
    ALIASES,
    FLOATING_DTYPES,
    DTypeLike,
    Ladder,
    canonical_dtype,
    dtype_name,
    half_dtype,
    max_value,
    require_x64,
    smallest_normal,
    unit_roundoff,
    x64_enabled,
)
from ._policy import (
    DTypeish,
    Policy,
    SemanticDType,
    cast_floating,
    current_policy,
    policy,
)
from .loss_scale import (
    DynamicLossScale,
    NoOpLossScale,
    StaticLossScale,
    all_finite,
    select_tree,
)

__version__ = "0.1.0"

# --- one result vocabulary ---
from ._status import Reason, Status, reason_name, status_message

# --- nlsq: imported eagerly (curve_fit is the scipy drop-in) ---
from . import nlsq  # noqa: E402
from .nlsq import NLSQResult, curve_fit, solve_nlsq  # noqa: E402
from .nlsq import Chunks  # noqa: E402  (streamed fits)

# --- everything else is imported on first use (`import adaptprec` should cost
# little more than `import jax`): ``ap.X`` resolves through ``__getattr__`` below. The
# imports under TYPE_CHECKING are for type checkers and the docs (griffe reads them).
_LAZY = {
    # guards, runtime, schedule
    "guards": ".guards", "GuardResult": ".guards", "Report": ".report",
    "monitor": "._monitor", "MixedPrecisionManager": ".runtime", "adaptive": ".runtime",
    "schedule": ".schedule", "PrecisionSchedule": ".schedule", "iterate": ".schedule",
    # linalg
    "linalg": ".linalg",
    # batched nlsq
    "BatchResult": ".batch", "solve_nlsq_batch": ".batch",
    # autocast: from the defining modules (``_autocast.explain`` is both a
    # module and a function of the package)
    **dict.fromkeys(("explain", "Explanation", "KindRow", "ScopeRow"),
                    "._autocast.explain"),
    "autocast": "._autocast.interpret",
    **dict.fromkeys(("PRESETS", "Rule", "ALWAYS_BF16", "ALWAYS_F16", "ALWAYS_F32",
                     "AUTO_MIXED", "AUTO_MIXED_BF16", "AUTO_MIXED_CONSERVATIVE",
                     "PrecisionPolicy"), "._autocast.presets"),
    **dict.fromkeys(("ScopeMatch", "ScopeRules"), "._autocast.scopes"),
    **dict.fromkeys(("PRIMITIVE_KINDS", "OpKind", "classify"), "._opkind"),
    # profiler and plots
    "Profile": "._profile", "ProfileRow": "._profile", "profile": "._profile",
    "FitTrace": "._plot", "plot_batch": "._plot", "plot_fit": "._plot",
    # layered precision and training steps
    **dict.fromkeys(("MixedGrads", "SkipNonFiniteState", "StepInfo", "loss_scale_of",
                     "mixed_value_and_grad", "skip_nonfinite", "train_step"), "._training"),
    # fit reports, intervals, bands, batch summaries
    "fit": ".analysis.fit", "FitResult": ".analysis.result",
    **dict.fromkeys(("fit_global", "GlobalFitResult"), ".analysis.global_fit"),
    **dict.fromkeys(("fit_odr", "ODRResult"), ".analysis.odr"),
    **dict.fromkeys(("Band", "fit_band"), ".analysis.bands"),
    **dict.fromkeys(("ProfileIntervals", "profile_intervals"), ".analysis.intervals"),
    **dict.fromkeys(("BatchSummary", "summarize_batch"), ".analysis.batch_summary"),
}
_SUBMODULES = ("guards", "schedule", "linalg")


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'adaptprec' has no attribute {name!r}")
    import importlib

    mod = importlib.import_module(module, __name__)
    value = mod if name in _SUBMODULES else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


if TYPE_CHECKING:  # pragma: no cover  (the lazy names, for type checkers and griffe)
    from . import guards, linalg, schedule
    # (griffe resolves these through the package: its ``explain`` shadows the module)
    from ._autocast import Explanation, KindRow, ScopeRow, explain
    from ._autocast.interpret import autocast
    from ._opkind import PRIMITIVE_KINDS, OpKind, classify
    from ._autocast.presets import (
        ALWAYS_BF16,
        ALWAYS_F16,
        ALWAYS_F32,
        AUTO_MIXED,
        AUTO_MIXED_BF16,
        AUTO_MIXED_CONSERVATIVE,
        PRESETS,
        PrecisionPolicy,
        Rule,
    )
    from ._autocast.scopes import ScopeMatch, ScopeRules
    from ._monitor import monitor
    from ._plot import FitTrace, plot_batch, plot_fit
    from ._profile import Profile, ProfileRow, profile
    from ._training import (
        MixedGrads,
        SkipNonFiniteState,
        StepInfo,
        loss_scale_of,
        mixed_value_and_grad,
        skip_nonfinite,
        train_step,
    )
    from .analysis.bands import Band, fit_band
    from .analysis.batch_summary import BatchSummary, summarize_batch
    from .analysis.intervals import ProfileIntervals, profile_intervals
    from .analysis.fit import fit
    from .analysis.global_fit import GlobalFitResult, fit_global
    from .analysis.odr import ODRResult, fit_odr
    from .analysis.result import FitResult
    from .batch import BatchResult, solve_nlsq_batch
    from .guards import GuardResult
    from .report import Report
    from .runtime import MixedPrecisionManager, adaptive
    from .schedule import PrecisionSchedule, iterate

__all__ = [
    # precision
    "ALIASES", "FLOATING_DTYPES", "DTypeLike", "Ladder", "canonical_dtype", "dtype_name",
    "half_dtype", "max_value", "require_x64", "smallest_normal", "unit_roundoff",
    "x64_enabled",
    # policy and loss scaling
    "DTypeish", "Policy", "SemanticDType", "cast_floating", "current_policy", "policy",
    "DynamicLossScale", "NoOpLossScale", "StaticLossScale", "all_finite", "select_tree",
    # vocabulary
    "Status", "Reason", "status_message", "reason_name",
    # runtime
    "guards", "GuardResult", "Report", "monitor", "MixedPrecisionManager", "adaptive",
    "schedule", "PrecisionSchedule", "iterate",
    # linalg, nlsq, batch
    "linalg", "nlsq", "NLSQResult", "curve_fit", "solve_nlsq", "BatchResult",
    "solve_nlsq_batch", "Chunks",
    # autocast
    "ALWAYS_BF16", "ALWAYS_F16", "ALWAYS_F32", "AUTO_MIXED", "AUTO_MIXED_BF16",
    "AUTO_MIXED_CONSERVATIVE", "PRESETS", "PRIMITIVE_KINDS", "Explanation", "OpKind",
    "PrecisionPolicy", "Rule", "autocast", "classify", "explain",
    # profiler and plots
    "profile", "Profile", "ProfileRow", "FitTrace", "plot_fit", "plot_batch",
    "KindRow", "ScopeRules",
    "ScopeMatch", "ScopeRow",
    # training steps
    "MixedGrads", "StepInfo", "SkipNonFiniteState", "mixed_value_and_grad",
    "skip_nonfinite", "train_step", "loss_scale_of",
    # fit reports
    "fit", "FitResult", "fit_global", "GlobalFitResult", "fit_odr", "ODRResult",
    "profile_intervals", "ProfileIntervals", "fit_band", "Band",
    "summarize_batch", "BatchSummary",
]
