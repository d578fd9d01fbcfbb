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

# --- one result vocabulary (issue 13) ---
from ._status import Reason, Status, reason_name, status_message

# --- guards, runtime, schedule (issue 3): re-exports below this line ---
from . import guards
from .guards import GuardResult
from .report import Report
from ._monitor import monitor
from .runtime import MixedPrecisionManager, adaptive
from . import schedule
from .schedule import PrecisionSchedule, iterate

# --- linalg (issue 7): re-exports below this line ---
from . import linalg  # noqa: E402  (users call ap.linalg.solve, ap.linalg.lstsq, ...)

# --- nlsq (issue 4): re-exports below this line ---
from . import nlsq  # noqa: E402
from .nlsq import NLSQResult, curve_fit, solve_nlsq  # noqa: E402
from .nlsq import Chunks  # noqa: E402  (issue 18: streamed fits)

# --- batched nlsq (issue 5): re-exports below this line ---
from .batch import BatchResult, solve_nlsq_batch

# --- autocast (issue 6): re-exports below this line ---
from ._autocast import (  # noqa: E402
    PRESETS,
    PRIMITIVE_KINDS,
    Explanation,
    KindRow,
    Rule,
    ScopeMatch,
    ScopeRow,
    ScopeRules,
    classify,
    ALWAYS_BF16,
    ALWAYS_F16,
    ALWAYS_F32,
    AUTO_MIXED,
    AUTO_MIXED_BF16,
    AUTO_MIXED_CONSERVATIVE,
    OpKind,
    PrecisionPolicy,
    autocast,
    explain,
)

# --- profiler and plots (issue 17): re-exports below this line ---
from ._profile import Profile, ProfileRow, profile  # noqa: E402
from ._plot import FitTrace, plot_batch, plot_fit  # noqa: E402  (matplotlib imported lazily)
# --- layered precision and training steps (issue 19): re-exports below this line ---
from ._training import (  # noqa: E402
    MixedGrads,
    SkipNonFiniteState,
    StepInfo,
    loss_scale_of,
    mixed_value_and_grad,
    skip_nonfinite,
    train_step,
)

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
    # training steps (issue 19)
    "MixedGrads", "StepInfo", "SkipNonFiniteState", "mixed_value_and_grad",
    "skip_nonfinite", "train_step", "loss_scale_of",
]
