"""specops.engine.structured_output: constrain output to a JSON schema, regex, choice or EBNF grammar.

xgrammar is the grammar backend; grammars compile in a worker pool as soon as a request
arrives (cached, with a hard timeout); each step the batch bitmask is filled on the CPU
while the GPU runs the forward and applied with ``specops.ops.apply_token_bitmask_``.
Speculative drafts are validated against the grammar and get one bitmask row per
position; reasoning models can be left unconstrained until an end-of-reasoning marker.
See manager.py for the calls the engine makes.
"""

from .backend import XgrammarBackend, bitmask_width, make_tokenizer_info
from .batch_bitmask import (BatchBitmask, BitmaskBuilder, BitmaskRequest, apply_batch_bitmask,
                            apply_token_bitmask, apply_token_bitmask_torch)
from .compiler_pool import CompilerPool, CompileStatus, CompileTicket
from .grammar_state import GrammarState
from .manager import StructuredOutputManager
from .options import StructuredOutputOptions
from .reasoning import ReasoningConfig, ReasoningGate

__all__ = [
    "BatchBitmask",
    "BitmaskBuilder",
    "BitmaskRequest",
    "CompileStatus",
    "CompileTicket",
    "CompilerPool",
    "GrammarState",
    "ReasoningConfig",
    "ReasoningGate",
    "StructuredOutputManager",
    "StructuredOutputOptions",
    "XgrammarBackend",
    "apply_batch_bitmask",
    "apply_token_bitmask",
    "apply_token_bitmask_torch",
    "bitmask_width",
    "make_tokenizer_info",
]
