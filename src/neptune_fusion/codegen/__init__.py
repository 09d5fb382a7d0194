"""Tile programs and their one emitter: plan -> TileProgram -> Triton source.

Pipeline: :func:`neptune_fusion.codegen.lower.lower` (plan + schedule -> tile program),
:func:`neptune_fusion.codegen.source.generate` (tile program -> source). See
docs/codegen.md.
"""
