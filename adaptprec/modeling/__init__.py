"""How a model becomes residuals: parameters held fixed, tied or constrained
(:mod:`.parameters`, expressions in :mod:`._expr`), likelihoods (:mod:`.likelihood`) and
complex-valued models (:mod:`.complex_model`).

A layer above ``nlsq``: the fitting entry points (``curve_fit``, ``solve_nlsq_batch``,
``ap.fit``) import it when a call asks for one of these, and it imports none of them.
"""
