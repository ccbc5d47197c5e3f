"""Triton kernels of specops, installed as specops.triton_kernels (never as a top-level name).

Each module holds one kernel beside its launcher. On CPU they run under the Triton
interpreter (TRITON_INTERPRET=1) in tests; the engine uses the torch path on CPU.
"""
