"""Demo: backend, devices, x64 state, the ladder's unit roundoffs, a policy cast."""

ORDER = 0
TITLE = "foundation: backend, ladder, policies"


def run() -> None:
    import jax
    import jax.numpy as jnp

    import adaptprec as ap

    print(f"jax {jax.__version__}, backend {jax.default_backend()}, "
          f"devices {[str(d) for d in jax.devices()]}")
    print(f"jax_enable_x64 = {ap.x64_enabled()}  (the demo application turns it on for its "
          "own process; the library never flips it)")
    ladder = ap.Ladder.parse("bf16,f16,f32,f64")
    print(f"{'rung':>5} {'unit roundoff':>14} {'max':>12} {'smallest normal':>16}")
    for d in ladder:
        print(f"{ap.dtype_name(d):>5} {ap.unit_roundoff(d):>14.3e} {ap.max_value(d):>12.3e} "
              f"{ap.smallest_normal(d):>16.3e}")
    print(f"'half' on this backend is {ap.half_dtype().name}")
    pol = ap.Policy.parse("p=f32,c=bf16,o=f32")
    params = {"dense": {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)},
              "step": jnp.array(0), "frozen": True}
    compute = pol.cast_to_compute(params)
    print(f"policy {pol}: w {params['dense']['w'].dtype} -> {compute['dense']['w'].dtype}, "
          f"step stays {compute['step'].dtype}, frozen stays {compute['frozen']!r}")
