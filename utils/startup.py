"""How a script starts: JAX's CPU devices and the garbage collector before the imports, and JAX's
persistent compilation cache, configured one way for every entry point (scripts, harness, search,
tests), so that no program writes entries another cannot read."""

import gc
import os
import pathlib

CACHE_MAX_BYTES = 2**30  # a search compiles a program per setting: the cache must not fill the disk


def before_imports() -> None:
    """For a script's __main__, before JAX starts (importing gymnax starts it): one CPU device per
    core and at least two, for the data-parallel update; and the garbage collector off while the
    imports load, their objects then frozen out of its later passes (after_imports)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    os.environ.setdefault("JAX_NUM_CPU_DEVICES", str(max(cores or 1, 2)))
    gc.disable()


def after_imports() -> None:
    gc.freeze()
    gc.enable()


def configure_compilation_cache(cache_dir: str) -> None:
    """JAX's persistent compilation cache in `cache_dir` ("" leaves it off) for every program, also
    those under JAX's 1 s default (a key split compiles fast), at most CACHE_MAX_BYTES, the least
    recently used going first. Entries that a JAX without the cap wrote have no access-time file,
    on which the cap's bookkeeping fails and no new entry is ever written: each gets one, dated
    0, so that it is the first to go."""
    import jax  # here, so that before_imports() runs before JAX starts

    if not cache_dir:
        return
    path = pathlib.Path(os.path.expanduser(cache_dir))
    if path.is_dir():
        for entry in path.glob("*-cache"):
            atime = entry.with_name(entry.name.removesuffix("-cache") + "-atime")
            if not atime.exists():
                atime.write_bytes((0).to_bytes(8, "little"))
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
