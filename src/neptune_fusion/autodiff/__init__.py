"""Reverse-mode differentiation of plain programs, on the IR (docs/autodiff.md).

* :mod:`.rules`: the derivative of every elementwise op and the adjoint of every reducer,
  as tables (``tests/autodiff/test_rules.py`` checks that no op of the IR lacks a row);
* :mod:`.reverse`: gradients of a program's outputs as new plain :class:`Compute` s;
* :mod:`.invert`: a load's indices solved for the loaded tensor's coordinates (what
  turns a gather in the forward into a gather in the backward);
* :mod:`.simplify`: the fold rules plus the few identities the derivation needs;
* :mod:`.softmax`: the saved log-sum-exp in place of a softmax's max and sum, and
  FlashAttention's ``delta = rowsum(dO * O)`` from the saved output;
* :mod:`.attention`: attention's backward programs derived from its forward definition.
"""
