"""Turning generated source into Triton kernels: compiled (CUDA) and interpreted (CPU).

Triton needs a kernel's source file (it re-parses the function), so the source is written
once to a content-addressed file in the kernel cache directory and imported as a module.
Triton decides between compiling and interpreting when ``@triton.jit`` runs, from
``TRITON_INTERPRET``, and the interpreter also consults it while it runs (Triton 3.9
imports parts of itself lazily during the first interpreted launch and checks the
variable then). So the module is imported twice, once per mode, each time with the
variable set for the duration of the import, and interpreted launches run with it set
too. :func:`neptune_fusion.settings.triton_interpret_as` is the one place that touches
the variable; a lock keeps concurrent users from seeing each other's setting.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from ..settings import cache_root
from ..settings import triton_interpret_as as interpreter_mode


def cache_dir() -> Path:
    """Where generated kernel sources live: ``<cache root>/kernels`` (see
    :func:`~neptune_fusion.settings.cache_root`: ``$NEPTUNE_FUSION_CACHE_DIR`` or
    ``~/.cache/neptune-fusion``)."""
    return cache_root() / "kernels"


@contextlib.contextmanager
def interpreted_launch():
    """Run interpreted kernels: ``TRITON_INTERPRET=1`` and Triton's standard library
    (``tl.max``, ``tl.sum``, ...) interpreted too.

    Triton builds ``triton.language.standard`` once, compiled or interpreted, when it is
    first imported; a process that imported it for CUDA cannot call those functions from
    an interpreted kernel. For the duration of the launch they are swapped for
    interpreted twins of the same Python functions, then restored.
    """
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    # kernels compute with -inf and exp2(-inf) on purpose: NumPy need not warn about it
    with interpreter_mode(True), np.errstate(all="ignore"):
        twins: dict[int, object] = {}
        saved: list[tuple[object, str, object]] = []
        for mod in (tl.standard, tl):
            for name, value in list(vars(mod).items()):
                if isinstance(value, JITFunction):
                    twin = twins.get(id(value))
                    if twin is None:
                        twin = twins[id(value)] = InterpretedFunction(value.fn)
                    saved.append((mod, name, value))
                    setattr(mod, name, twin)
        try:
            yield
        finally:
            for mod, name, value in reversed(saved):
                setattr(mod, name, value)


def write_source(source: str, stem: str) -> Path:
    """Write ``source`` to ``<cache>/<stem>_<hash>.py`` (once) and return the path."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    for root in (cache_dir(), Path(tempfile.gettempdir()) / "neptune_fusion_kernels"):
        try:
            root.mkdir(parents=True, exist_ok=True)
            path = root / f"{stem}_{digest}.py"
            if not path.exists() or path.read_text() != source:
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(source)
                os.replace(tmp, path)
            return path
        except OSError:
            continue
    raise OSError("no writable directory for generated kernels; set NEPTUNE_FUSION_CACHE_DIR")


def import_kernel_module(path: Path, interpret: bool) -> ModuleType:
    """Import the generated module at ``path`` in one mode (a fresh module object)."""
    name = f"_nf_kernel_{path.stem}_{'interp' if interpret else 'cuda'}"
    if interpret:
        _preload_for_interpreter()
    with interpreter_mode(interpret):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # Triton's interpreter looks functions up by module
        spec.loader.exec_module(module)
    return module


def _preload_for_interpreter() -> None:
    # Triton 3.9 imports triton.experimental.gluon lazily inside the first launch, while
    # the interpreter has patched triton.language; importing it here avoids that.
    with contextlib.suppress(Exception):
        import triton.experimental.gluon  # noqa: F401
