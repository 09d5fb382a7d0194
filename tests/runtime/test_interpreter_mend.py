"""The mend of Triton 3.6's interpreter (runtime/loader.mend_interpreter_index): a
scalar used as a loop bound must index under NumPy releases that refuse ``int()`` of a
one-element array. CI's Triton already squeezes; this test plays 3.6's function."""

from __future__ import annotations

import numpy as np


def test_a_one_element_scalar_indexes_after_the_mend(monkeypatch):
    from triton.runtime import interpreter

    from neptune_fusion.runtime import loader

    def triton36(tensor, scope):   # Triton 3.6's __index__, as it reads
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", triton36)
    loader.mend_interpreter_index()
    mended = interpreter._patch_lang_tensor
    try:
        int(np.zeros(1, dtype=np.int32))
    except TypeError:
        pass
    else:   # an older NumPy converts: nothing to mend
        assert mended is triton36
        return
    assert mended is not triton36

    class Scope:
        def set_attr(self, obj, name, value):
            setattr(obj, name, value)

    class Tensor:
        pass

    mended(Tensor, Scope())
    t = Tensor()
    t.handle = type("Handle", (), {"data": np.array([7], dtype=np.int32)})()
    assert list(range(t)) == list(range(7))
    loader.mend_interpreter_index()            # once: not wrapped again
    assert interpreter._patch_lang_tensor is mended
