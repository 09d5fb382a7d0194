"""How to launch a generated kernel, as plain data that survives a process.

A :class:`KernelSpec` holds everything :class:`~neptune_fusion.runtime.kernel.Kernel`
needs besides the input tensors: the generated source, the grid (row extent, grid
extents, split count) in terms of size *names*, the outputs to allocate, and where each
kernel argument comes from (a tensor, a stride, a size, a tile size). It is built from a
:class:`~neptune_fusion.codegen.program.TileProgram` (:func:`specs_of`) and written to
the cache as JSON, so a warm ``nf.compile`` of a program seen before needs neither the
algebra (SymPy) nor lowering: the fingerprint of the definition finds the specs, the
source is compiled, and the plan is derived only if someone asks for it.

Tensors are named by keys: ``in<k>`` is input ``k``; every other tensor (outputs, the
split-k workspace that one kernel writes and the next reads) gets ``t<n>`` in order of
first appearance. Extents are ints or size names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import NeptuneError
from ..ir.nodes import Size
from ..ir.pow2 import tile_extent

Ext = int | str


@dataclass(frozen=True)
class KernelSpec:
    name: str                                    # the kernel function's name
    source: str                                  # the generated module
    rows: Ext
    grid: tuple[Ext, ...]                        # flattened into program_id(1)
    block_m: int
    splits: int                                  # split-k partial: grid z; else 0
    outputs: tuple[tuple[str, tuple[Ext, ...], str], ...]   # (key, shape, torch dtype)
    args: tuple[tuple, ...]    # ("tensor", key) ("stride", key, d) ("size", name)
    #                            ("visits",) ("block", int)
    #                            ("block_ext", ext[, cap]) ("flag",) ("tma",)
    #                            ("even", ext, block_n) ("one", ext, block_n)
    #                            ("desc", key, box, swizzle, bits): a host-side TMA
    #                            descriptor over tensor key (runtime/descriptors.py)
    #                            ("dense", key, strides): whether tensor key has these
    #                            strides (codegen/source.dense_candidates)
    num_warps: int
    num_stages: int
    count_visits: bool
    col_blocks: int = 1              # split-k combine: programs over the col axis (grid z)
    # column tiles across programs (Schedule.block_col): (col extent, tile); the row x
    # column tiles are flattened into program_id(0)
    col_tile: tuple = ()
    # the size arguments Triton specialises on (codegen/source.unspecialized_sizes)
    specialized: tuple[str, ...] = ()
    # Schedule.row_programs of a kernel that walks its row blocks (codegen/source.
    # walks_rows): the row grid is capped at this many programs per multiprocessor
    # whenever the one tile runs (no ONE_TILE argument, or ONE_TILE >= 1)
    row_programs: int = 0
    # the source's dialect (Schedule.dialect): "gluon" kernels run on CUDA only and take
    # one more parameter, the constexpr STAGES (the schedule's num_stages), last
    dialect: str = "triton"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> KernelSpec:
        """The spec of :meth:`to_dict`'s output; :class:`NeptuneError` if malformed."""
        try:
            spec = cls(
                name=str(d["name"]), source=str(d["source"]), rows=_ext(d["rows"]),
                grid=tuple(_ext(g) for g in d["grid"]), block_m=int(d["block_m"]),
                splits=int(d["splits"]),
                outputs=tuple((str(k), tuple(_ext(x) for x in shape), str(dt))
                              for k, shape, dt in d["outputs"]),
                args=tuple(tuple(_ext(x) if isinstance(x, (int, str)) else x for x in a)
                           for a in d["args"]),
                num_warps=int(d["num_warps"]), num_stages=int(d["num_stages"]),
                count_visits=bool(d["count_visits"]),
                col_blocks=int(d.get("col_blocks", 1)),
                col_tile=tuple(_ext(x) for x in d.get("col_tile", ())),
                specialized=tuple(str(x) for x in d.get("specialized", ())),
                row_programs=int(d.get("row_programs", 0)),
                dialect=str(d.get("dialect", "triton")))
        except (KeyError, TypeError, ValueError) as err:
            raise NeptuneError(f"malformed kernel spec: {err!r}") from None
        if not spec.name.isidentifier():   # it names the kernel function and its module
            raise NeptuneError(f"malformed kernel spec: name {spec.name!r} is not an "
                               "identifier")
        kinds = {"tensor", "stride", "size", "visits", "block", "block_ext", "flag", "tma",
                 "even", "one", "desc", "dense"}
        if not all(a and a[0] in kinds for a in spec.args):
            raise NeptuneError("malformed kernel spec: unknown argument kind")
        if spec.dialect not in ("triton", "gluon"):
            raise NeptuneError(f"malformed kernel spec: dialect {spec.dialect!r}")
        return spec


def _launch_warps(s) -> int:
    """The launch's ``num_warps``: the schedule's, or for a Gluon kernel its default
    partition's (codegen/gluon.py: the other partitions' warps come on top)."""
    if s.dialect == "gluon":
        from ..codegen.gluon import LAUNCH_WARPS
        return LAUNCH_WARPS
    return s.num_warps


def _ext(x):
    if isinstance(x, bool) or not isinstance(x, (int, str)):
        raise ValueError(f"not an extent: {x!r}")
    return x


def ext_of(e) -> Ext:
    return e.name if isinstance(e, Size) else int(e)


def specs_of(programs, inputs, sources) -> tuple[KernelSpec, ...]:
    """The kernel specs of ``programs`` (one per generated kernel, in launch order)."""
    from ..codegen.gluon import gluon_args
    from ..codegen.source import dense_strides, kernel_args, unspecialized_sizes, walks_rows
    keys = {p: f"in{k}" for k, p in enumerate(inputs)}

    def key(t) -> str:
        if t not in keys:
            keys[t] = f"t{len(keys) - len(inputs)}"
        return keys[t]

    specs = []
    for prog, src in zip(programs, sources):
        stage = prog.split.stage if prog.split is not None else None
        outs = []
        for o in prog.outputs:    # the split-k workspace is float32 placeholders
            t = o.arg.tensor
            outs.append((key(t), tuple(ext_of(s) for s in t.shape), t.dtype.name))
        args = []
        for a in gluon_args(prog) if prog.schedule.dialect == "gluon" else kernel_args(prog):
            if a.kind == "tensor":
                args.append(("tensor", key(a.ref.tensor)))
            elif a.kind == "stride":
                t, d = a.ref
                args.append(("stride", key(t.tensor), d))
            elif a.kind == "size":
                args.append(("size", a.ref.name))
            elif a.kind == "visits":
                args.append(("visits",))
            elif a.kind == "block":
                ax = a.ref
                if ax.block_size is not None:
                    args.append(("block", ax.block_size))
                elif isinstance(ax.extent, int):
                    args.append(("block", tile_extent(ax.extent)))
                else:
                    # the tile covering a symbolic extent, capped for a chunked column
                    args.append(("block_ext", ax.extent.name) if ax.chunk is None else
                                ("block_ext", ax.extent.name, ax.chunk))
            elif a.kind == "tma":
                args.append(("tma",))
            elif a.kind in ("even", "one"):   # (kind, length, BLOCK_N): kernel.flag_value
                args.append((a.kind, a.ref.name, prog.schedule.block_n))
            elif a.kind == "desc":
                d = a.ref
                args.append(("desc", key(d.arg.tensor), list(d.block), d.swizzle, d.bits))
            elif a.kind == "dense":
                args.append(("dense", key(a.ref.tensor), list(dense_strides(a.ref))))
            else:
                args.append(("flag",))
        s = prog.schedule
        specs.append(KernelSpec(
            name=prog.name, source=src, rows=ext_of(prog.row.extent),
            grid=tuple(ext_of(a.extent) for a in prog.grid), block_m=s.block_m,
            splits=prog.split.splits if stage == "partial" else 0,
            outputs=tuple(outs), args=tuple(args), num_warps=_launch_warps(s),
            num_stages=s.num_stages, count_visits=s.count_visits,
            col_blocks=prog.split.col_blocks if stage == "combine" else 1,
            col_tile=(ext_of(prog.col.extent), prog.col.block_size)
            if prog.col is not None and prog.col.programs else (),
            specialized=tuple(a.ref.name for a in kernel_args(prog) if a.kind == "size"
                              and a.ref not in unspecialized_sizes(prog)),
            row_programs=s.row_programs if walks_rows(prog) or s.dialect == "gluon" else 0,
            dialect=s.dialect))
    return tuple(specs)
