"""specops: the last step of LLM decoding as fast, exact ops.

Importing specops loads the compiled extension specops._C, which registers the
`torch.ops.specops.*` operators (CPU always, CUDA where the build had CUDA).
"""

try:
    from specops import _C  # noqa: F401  (registers torch.ops.specops.*)
except ImportError as exc:  # pragma: no cover - only on a broken install
    raise ImportError(
        "specops._C is missing: build the extension with "
        "`pip install --no-build-isolation -e .` (see README.md)") from exc

__version__ = "0.1.0"
