"""Turning generated source into Triton kernels: compiled (CUDA) and interpreted (CPU).

The source is compiled from memory -- the exact text of the kernel spec, which the
pipeline generated in this process or read (and checked) from the private disk cache,
see docs/cache.md -- with :func:`compile` and executed into a fresh module. No file is
written, read or imported for it, so there is nothing on disk (a kernel file, a
``__pycache__`` entry) that could be swapped in between the check and the use. Triton
reads a kernel's source through :mod:`inspect`, which asks :mod:`linecache`; the text is
registered there under a ``<neptune-fusion kernel ...>`` name that no file is looked up
by.

Triton decides between compiling and interpreting when ``@triton.jit`` runs, from
``TRITON_INTERPRET``, and the interpreter also consults it while it runs (Triton 3.9
imports parts of itself lazily during the first interpreted launch and checks the
variable then). So the module is executed twice, once per mode, each time with the
variable set for the duration, and interpreted launches run with it set too.
:func:`neptune_fusion.settings.triton_interpret_as` is the one place that touches the
variable; a lock keeps concurrent users from seeing each other's setting.
"""

from __future__ import annotations

import contextlib
import hashlib
import linecache
import sys
from types import ModuleType

from ..errors import CodegenError
from ..settings import triton_interpret_as as interpreter_mode


@contextlib.contextmanager
def interpreted_launch():
    """Run interpreted kernels: ``TRITON_INTERPRET=1`` and Triton's standard library
    (``tl.max``, ``tl.sum``, ...) interpreted too.

    Triton builds ``triton.language.standard`` once, compiled or interpreted, when it is
    first imported; a process that imported it for CUDA cannot call those functions from
    an interpreted kernel. For the duration of the launch they are swapped for
    interpreted twins of the same Python functions, then restored.

    Triton's interpreter also patches the language modules while a kernel runs (its
    builtins call the interpreter's semantics), and a *nested* interpreted call -- one
    of the twins above, called from the kernel -- patches ``triton.language.core``
    without restoring it (Triton 3.6 and 3.9). Left so, every later compile of a GPU
    kernel in the process failed ("'ir.value' object has no attribute 'dtype'"). Every
    attribute of the patched modules and classes is restored as it was before the launch
    (:func:`_language_state`).
    """
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    # kernels compute with -inf and exp2(-inf) on purpose: NumPy need not warn about it
    with interpreter_mode(True), np.errstate(all="ignore"):
        state = _language_state()   # before the twins go in: restored without them
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
            _restore(state)


def _language_state() -> list:
    """``(object, its attributes)`` of what Triton's interpreter patches: the language
    modules and the classes whose methods it replaces."""
    import triton.language as tl
    core = tl.core
    objs = [tl, core, tl.math]
    objs += [c for c in (getattr(core, n, None) for n in ("tensor", "dtype", "condition",
                                                          "tensor_descriptor_base"))
             if isinstance(c, type)]
    return [(o, dict(vars(o))) for o in objs]


def _restore(state: list) -> None:
    """Put every attribute of :func:`_language_state`'s objects back as it was (a
    submodule imported meanwhile stays: the package's attribute is how it is reached)."""
    for obj, before in state:
        now = vars(obj)
        for name in [n for n, v in now.items() if n not in before
                     and not isinstance(v, ModuleType)]:
            delattr(obj, name)
        for name, value in before.items():
            if now.get(name, _MISSING) is not value:
                setattr(obj, name, value)


_MISSING = object()


def kernel_stem(source: str, name: str) -> str:
    """``NAME_HASH``: the kernel function's name (checked to be an identifier) and the
    first 16 hex digits of the SHA-256 of ``source``."""
    if not name.isidentifier():
        raise CodegenError(f"kernel name {name!r} is not a Python identifier")
    return f"{name}_{hashlib.sha256(source.encode('utf-8')).hexdigest()[:16]}"


def load_kernel_module(source: str, name: str, interpret: bool) -> ModuleType:
    """Compile ``source`` (this very text: nothing is read from disk) and execute it into
    a fresh module, in one mode; ``name`` is the kernel function's (an identifier)."""
    stem = kernel_stem(source, name)
    # the angle brackets tell linecache never to look for this name on disk
    filename = f"<neptune-fusion kernel {stem}>"
    code = compile(source, filename, "exec", dont_inherit=True)
    lines = source.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    # mtime None: linecache.checkcache keeps the entry (there is no file to compare with)
    linecache.cache[filename] = (len(source), None, lines, filename)
    modname = f"_nf_kernel_{stem}_{'interp' if interpret else 'cuda'}"
    module = ModuleType(modname)
    if interpret:
        _preload_for_interpreter()
    with interpreter_mode(interpret):
        sys.modules[modname] = module  # Triton's interpreter looks functions up by module
        exec(code, module.__dict__)  # noqa: S102 - the generated kernel, from memory
    return module


def _preload_for_interpreter() -> None:
    # Triton 3.9 imports triton.experimental.gluon lazily inside the first launch, while
    # the interpreter has patched triton.language; importing it here avoids that.
    with contextlib.suppress(Exception):
        import triton.experimental.gluon  # noqa: F401
    mend_interpreter_index()


def mend_interpreter_index() -> None:
    """Triton 3.6's interpreter reads a scalar used as an index (a loop bound) with
    ``int(data)`` of a one-element array, which NumPy 2.4 refuses ("only 0-dimensional
    arrays can be converted to Python scalars"): every kernel with a computed loop bound
    failed on CPU tensors there (torch 2.11's Triton with a current NumPy). Triton 3.9
    squeezes the array first; this gives 3.6's interpreter the same ``__index__``. A
    compatibility mend of Triton's module, made once, only where it is needed."""
    import numpy as np
    from triton.runtime import interpreter
    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "_nf_mended", False):
        return
    try:
        int(np.zeros(1, dtype=np.int32))
        return                                   # this NumPy still converts
    except TypeError:
        pass
    import inspect
    if ".squeeze()" in inspect.getsource(patch):
        return                                   # this Triton already squeezes

    def mended(tensor, scope, _patch=patch):
        _patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    mended._nf_mended = True
    interpreter._patch_lang_tensor = mended
