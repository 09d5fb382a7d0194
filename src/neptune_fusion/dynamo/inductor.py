"""The rest of a graph handed to Inductor as torch.compile's own Inductor entry hands it.

``torch.compile(fn)`` enters Inductor through ``compile_fx``, which runs AOTAutograd and
compiles each resulting graph with ``compile_fx_inner``, telling it what the graph is:
an inference graph or a training forward, its inputs at fixed addresses (parameters and
buffers), the device box its forward and backward share. The backend runs AOTAutograd
itself (its decompositions, the fusion pass on the forward graph), so it passes the same:
Inductor's CUDA graphs (``mode="reduce-overhead"``) need them -- an inference graph
replays without waiting for a backward, a weight is not copied into the graph's pool on
every call, a backward finds its forward's device.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def inductor_patches(mode: str | None, options: dict | None) -> dict:
    """The Inductor configuration of torch.compile's ``mode`` and ``options``
    (``torch._inductor.list_mode_options``; ``options`` win), patched in while the rest
    compiles. ``"reduce-overhead"`` turns on Inductor's CUDA graphs
    (``triton.cudagraphs``): the whole compiled graph, fused kernels included, is
    recorded once per shape and replayed (docs/jit.md)."""
    from ..errors import NeptuneError
    try:
        from torch._inductor import list_mode_options
        patches = dict(list_mode_options(mode or "default"))
    except (RuntimeError, KeyError) as err:
        raise NeptuneError(f"mode={mode!r}: {err}") from None
    patches.update(options or {})
    return patches


def _inductor(name: str):
    """An Inductor helper of ``compile_fx``'s, wherever this torch keeps it."""
    from torch._inductor import compile_fx, utils
    return getattr(utils, name, None) or getattr(compile_fx, name)


def _device_box():
    return _inductor("BoxedDeviceIndex")(None)


@dataclass
class GraphArgs:
    """What ``compile_fx`` tells ``compile_fx_inner`` about the graphs AOTAutograd makes
    of one Dynamo graph of ``dynamo_inputs`` inputs."""

    dynamo_inputs: int
    device: object = field(default_factory=_device_box)   # shared by forward and backward

    def forward(self, inputs, inference: bool) -> dict:
        """A forward graph's: inputs that AOTAutograd lifted (parameters, buffers) or
        that Dynamo marked static keep their addresses between calls."""
        fixed = _inductor("num_fw_fixed_arguments")(self.dynamo_inputs, len(inputs))
        return dict(static_input_idxs=_inductor("get_static_input_idxs")(fixed),
                    is_inference=inference, boxed_forward_device_index=self.device)

    def backward(self, gm) -> dict:
        """The backward graph's: its leading inputs (the saved parameters) are fixed."""
        fixed = _inductor("count_tangents")(gm)
        return dict(static_input_idxs=list(range(fixed)), is_backward=True,
                    boxed_forward_device_index=self.device)


def compile_rest(gm, example_inputs, patches: dict, kwargs: dict):
    """``gm`` (fused regions already replaced by kernel calls) compiled by Inductor under
    ``patches``; CUDA graphs, when the patches turn them on, wrap the compiled call
    before the patches are lifted."""
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner
    with inductor_config.patch(patches):
        return compile_fx_inner(gm, example_inputs, **kwargs)
