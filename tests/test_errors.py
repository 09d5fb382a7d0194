"""One test per user-facing error: the class, and the names the message must give."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import neptune_fusion as nf


@pytest.fixture
def prog():
    """x[N, D] and a row sum y[N] = sum_j x[i, j]."""
    N, D = nf.sizes("N D")
    x = nf.placeholder((N, D), name="x")
    j = nf.reduce_axis(D, "j")
    y = nf.compute((N,), lambda i: nf.sum(x[i, j], j), name="y")
    return N, D, x, j, y


@contextlib.contextmanager
def raises(cls, *parts):
    """``pytest.raises`` that also checks every part appears in the message."""
    with pytest.raises(cls) as info:
        yield info
    msg = str(info.value)
    for p in parts:
        assert p in msg, f"{p!r} not in {msg!r}"


def test_every_error_is_a_neptune_error():
    for cls in (nf.DTypeError, nf.ExprError, nf.ShapeError, nf.IndexBoundsError,
                nf.AxisError, nf.FeedError, nf.SizeBindingError, nf.VerificationError,
                nf.FusionError):
        assert issubclass(cls, nf.NeptuneError)


# ------------------------------------------------------------------ building


def test_wrong_number_of_indices(prog):
    N, D, x, j, y = prog
    with raises(nf.ShapeError, "'x'", "2 dimension(s)", "1 index"):
        nf.compute((N,), lambda i: x[i], name="z")


def test_constant_index_out_of_extent():
    x = nf.placeholder((4, 3), name="x")
    with raises(nf.IndexBoundsError, "index 1 of tensor 'x'", "constant 3", "extent 3"):
        x[0, 3]


def test_negative_constant_index(prog):
    N, D, x, j, y = prog
    with raises(nf.IndexBoundsError, "index 0 of tensor 'x'", "constant -1"):
        x[-1, j]


def test_axis_with_larger_extent():
    x = nf.placeholder((4, 3), name="x")
    j = nf.reduce_axis(5, "j")
    with raises(nf.IndexBoundsError, "tensor 'x'", "axis 'j'", "5", "extent 3"):
        x[0, j]


def test_mismatched_symbolic_extents(prog):
    N, D, x, j, y = prog
    M = nf.size("M")
    with raises(nf.ShapeError, "tensor 'x'", "axis 'i'", "extent M", "extent N"):
        nf.compute((M,), lambda i: x[i, 0], name="z")


def test_unknown_dtype():
    with raises(nf.DTypeError, "'x'", "'float31'", "float32"):
        nf.placeholder((3,), "float31", name="x")


def test_unknown_dtype_in_cast(prog):
    N, D, x, j, y = prog
    with raises(nf.DTypeError, "'complex64'"):
        nf.cast(x[0, j], "complex64")


def test_reduction_over_unused_axis(prog):
    N, D, x, j, y = prog
    k = nf.reduce_axis(D, "k")
    with raises(nf.AxisError, "nf.sum", "axis 'k'", "x[i, j2]"):
        nf.compute((N, D), lambda i, j2: nf.sum(x[i, j2], k), name="z")


def test_reduction_over_a_spatial_axis(prog):
    N, D, x, j, y = prog
    with raises(nf.AxisError, "nf.max", "spatial axis 'c'", "not a reduce axis",
                "nf.reduce_axis"):
        nf.compute((N, D), lambda i, c: nf.max(x[i, c], c), name="z")


def test_reduce_axis_used_outside_a_reduction(prog):
    N, D, x, j, y = prog
    with raises(nf.AxisError, "compute 'z'", "reduce axis 'j'", "nf.sum(..., j)"):
        nf.compute((N,), lambda i: x[i, j], name="z")


def test_axis_of_another_compute(prog):
    N, D, x, j, y = prog
    other = y.axes[0]
    with raises(nf.AxisError, "compute 'z'", f"axis {other.name!r}", "another compute"):
        nf.compute((N,), lambda r: y[other] + y[r], name="z")


def test_non_constant_exponent(prog):
    N, D, x, j, y = prog
    with raises(nf.ExprError, "exponent", "x[i, 0]", "constant"):
        nf.compute((N,), lambda i: x[i, 1] ** x[i, 0], name="z")


def test_integer_to_negative_power():
    n = nf.placeholder((3,), "int64", name="n")
    with raises(nf.DTypeError, "n[i] ** -1", "nf.cast"):
        nf.compute((3,), lambda i: n[i] ** -1, name="z")


def test_non_boolean_where_condition(prog):
    N, D, x, j, y = prog
    with raises(nf.ExprError, "nf.where", "boolean", "x[i, 0]", "float32"):
        nf.compute((N,), lambda i: nf.where(x[i, 0], 1.0, 0.0), name="z")


def test_arithmetic_on_a_boolean(prog):
    N, D, x, j, y = prog
    with raises(nf.DTypeError, "'add'", "x[i, 0] < 0.0", "nf.where"):
        nf.compute((N,), lambda i: (x[i, 0] < 0.0) + 1.0, name="z")


def test_compute_function_with_wrong_arity(prog):
    N, D, x, j, y = prog
    with raises(nf.ShapeError, "compute 'z'", "2 dimension(s)", "1 index argument"):
        nf.compute((N, D), lambda i: x[i, 0], name="z")


def test_compute_function_returning_a_tensor(prog):
    N, D, x, j, y = prog
    with raises(nf.ExprError, "compute 'z'", "tensor 'x'", "index it"):
        nf.compute((N,), lambda i: x, name="z")


def test_bad_size_name():
    with raises(nf.ShapeError, "'2N'", "identifier"):
        nf.size("2N")


def test_bool_of_comparison_is_a_type_error(prog):
    N, D, x, j, y = prog
    a, b = x[0, j], x[1, j]
    with raises(TypeError, "no truth value", "nf.where"):
        bool(a < b)
    with raises(TypeError, "no truth value"):
        if a < b:
            pass


def test_iterating_a_tensor_is_a_type_error(prog):
    N, D, x, j, y = prog
    with raises(TypeError, "'y'", "not iterable"):
        list(y)


# ------------------------------------------------------------------ evaluating


def test_missing_feed(prog):
    N, D, x, j, y = prog
    with raises(nf.FeedError, "missing feed", "'x'", "[N, D]"):
        nf.evaluate(y, {})


def test_unknown_feed_name(prog, rng):
    N, D, x, j, y = prog
    with raises(nf.FeedError, "'xx'", "no input", "x"):
        nf.evaluate(y, {"x": rng.standard_normal((2, 3)), "xx": rng.standard_normal(3)})


def test_feed_for_an_unread_placeholder(prog, rng):
    N, D, x, j, y = prog
    other = nf.placeholder((3,), name="other")
    with raises(nf.FeedError, "'other'", "do not read"):
        nf.evaluate(y, {x: rng.standard_normal((2, 3)), other: rng.standard_normal(3)})


def test_feed_of_wrong_rank(prog, rng):
    N, D, x, j, y = prog
    with raises(nf.FeedError, "'x'", "2 dimension(s)", "(6,)"):
        nf.evaluate(y, {"x": rng.standard_normal(6)})


def test_feed_of_wrong_concrete_shape(rng):
    x = nf.placeholder((4, 3), name="x")
    j = nf.reduce_axis(3, "j")
    y = nf.compute((4,), lambda i: nf.sum(x[i, j], j), name="y")
    with raises(nf.FeedError, "'x'", "[4, 3]", "dimension 1 is 5", "expected 3"):
        nf.evaluate(y, {"x": rng.standard_normal((4, 5))})


def test_feed_of_wrong_dtype_kind(rng):
    n = nf.placeholder((3,), "int32", name="n")
    y = nf.compute((3,), lambda i: n[i] * 2, name="y")
    with raises(nf.FeedError, "'n'", "int32", "floating", "integer"):
        nf.evaluate(y, {"n": rng.standard_normal(3)})


def test_size_bound_to_two_values(rng):
    N = nf.size("N")
    a = nf.placeholder((N,), name="a")
    b = nf.placeholder((N,), name="b")
    y = nf.compute((N,), lambda i: a[i] + b[i], name="y")
    with raises(nf.SizeBindingError, "size N", "3", "4", "'a'", "'b'"):
        nf.evaluate(y, {"a": rng.standard_normal(3), "b": rng.standard_normal(4)})


def test_unbound_size():
    N = nf.size("N")
    y = nf.compute((N,), lambda i: nf.const(1.0), name="y")
    with raises(nf.FeedError, "size N", "not bound"):
        nf.evaluate(y, {})


def test_outputs_must_be_computes(prog):
    N, D, x, j, y = prog
    with raises(nf.NeptuneError, "nf.compute"):
        nf.evaluate(x, {"x": np.ones((2, 3))})


def test_unknown_evaluate_mode(prog, rng):
    N, D, x, j, y = prog
    with raises(nf.NeptuneError, "'fast'", "unfused"):
        nf.evaluate(y, {"x": rng.standard_normal((2, 3))}, mode="fast")
