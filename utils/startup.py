"""How a script starts: JAX's CPU devices and the garbage collector before the imports, then JAX's
matrix-product precision and persistent compilation cache, configured one way for every entry
point (scripts, harness, search, tests), so that every program computes alike and none writes
cache entries another cannot read."""

import concurrent.futures
import contextlib
import ctypes
import gc
import importlib
import os
import pathlib
import sys
import types
from collections.abc import Callable
from typing import Any

CACHE_MAX_BYTES = 2**30  # a search compiles a program per setting: the cache must not fill the disk
# Imported on first use: seaborn, which gymnax imports for Pong's render alone (with pandas and
# scipy.stats), and pyplot, for its renders; boto3, which tensorboardX imports for S3 alone; and the
# pictures and the log, which a run needs only once its programs are compiled, its peak of memory.
DEFERRED = ("seaborn", "matplotlib.pyplot", "boto3", "utils.visualize", "utils.logger")
M_ARENA_MAX = -8  # glibc's mallopt parameter
# float32 matrix products and convolutions in float32 on every device. A TPU's default multiplies
# them in one pass of bfloat16 (about three digits); a CPU computes the same bits either way. What
# it costs on a TPU: docs/accelerators.md. JAX_DEFAULT_MATMUL_PRECISION overrides.
MATMUL_PRECISION = "highest"


def precision_environment() -> str:
    """"JAX_DEFAULT_MATMUL_PRECISION=high" (say) where the environment sets another precision than
    MATMUL_PRECISION, else "": what a recorded command needs before it to run the same products
    (on a TPU another precision gives other numbers)."""
    value = os.environ.get("JAX_DEFAULT_MATMUL_PRECISION", MATMUL_PRECISION)
    own = {MATMUL_PRECISION, "float32"}  # JAX's two names of it
    return "" if value in own else f"JAX_DEFAULT_MATMUL_PRECISION={value}"


class DeferredModule(types.ModuleType):
    """Stands in sys.modules for a module not imported yet; its first attribute looked up imports
    the module, and every lookup is answered by it."""

    def __getattr__(self, name: str):
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), name)


def before_imports() -> None:
    """For a script's __main__, before JAX starts (importing gymnax starts it): one CPU device per
    core and at least two, for the data-parallel update; the garbage collector off while the
    imports load, their objects then frozen out of its later passes (after_imports); the modules of
    DEFERRED imported only when something uses them; and one malloc arena per core."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    os.environ.setdefault("JAX_NUM_CPU_DEVICES", str(max(cores or 1, 2)))
    gc.disable()
    for name in DEFERRED:
        sys.modules.setdefault(name, DeferredModule(name))
    # glibc gives threads up to 8 arenas per core, whose freed memory no other arena reuses: XLA's
    # compiler threads each held their own. One per core: a cold compile of PPO's update step
    # peaked ~40 MB lower than by default; one for all threads slowed PPO's training ~7%. glibc's
    # own MALLOC_ARENA_MAX, where set, is left to decide.
    if "MALLOC_ARENA_MAX" not in os.environ:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").mallopt(M_ARENA_MAX, cores or 1)


def after_imports() -> None:
    gc.freeze()
    gc.enable()


def configure_jax(cache_dir: str) -> None:
    """JAX's float32 matrix-product precision (MATMUL_PRECISION), then its persistent compilation
    cache in `cache_dir` ("" leaves it off) for every program, also those under JAX's 1 s default
    (a key split compiles fast), at most CACHE_MAX_BYTES, the least recently used going first.
    Entries that a JAX without the cap wrote have no access-time file, on which the cap's
    bookkeeping fails and no new entry is ever written: each gets one, dated 0, so that it is the
    first to go."""
    import jax  # here, so that before_imports() runs before JAX starts

    if "JAX_DEFAULT_MATMUL_PRECISION" not in os.environ:
        jax.config.update("jax_default_matmul_precision", MATMUL_PRECISION)
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


def release_freed_memory() -> None:
    """Frees the garbage that only the collector finds (a trace's cycles) and gives the memory that
    glibc's allocator holds freed back to the system (malloc_trim): after compiling, what XLA's
    compiler used would otherwise count in the run's peak."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def in_background(fn: Callable[[], Any]) -> concurrent.futures.Future:
    """fn() started in a thread of its own, which ends with it: on a GPU or TPU, whose host would
    otherwise idle, a program compiled (or an initial state made) while the device works."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(fn)
    pool.shutdown(wait=False)
    return future
