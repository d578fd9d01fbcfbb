import jax

jax.config.update("jax_enable_x64", True)


def pytest_configure(config):
    for mark in ("parallel_threads_limit", "fail_slow", "thread_unsafe", "slow",
                 "xslow", "parallel_threads"):
        config.addinivalue_line("markers", f"{mark}: scipy's own marker")
