"""Integrations with other libraries, each an optional extra (imported on demand).

* :mod:`.transformers`: ``attn_implementation="neptune_fusion"`` for Hugging Face models
  (``pip install 'neptune-fusion[transformers]'``), see docs/transformers.md.
"""
