"""mps_backend: lower PyTorch models to the ExecuTorch MPS delegate.

    from mps_backend import MPSPartitioner
    edge = to_edge_transform_and_lower(torch.export.export(model, args), partitioner=[MPSPartitioner()])

Importing this package registers the MPS recipe provider with ``executorch.export`` (as XNNPACK, CoreML
and QNN register theirs; ``mps_backend.recipes``), its one side effect; the partitioner and backend
load on first use.
"""

from . import recipes as _recipes  # noqa: F401  (registers MPSRecipeProvider with executorch.export)

__version__ = "0.1.0"

__all__ = ["MPSBackend", "MPSPartitioner", "__version__"]


def __getattr__(name):
    if name == "MPSPartitioner":
        from .partitioner import MPSPartitioner  # noqa: PLC0415

        return MPSPartitioner
    if name == "MPSBackend":
        from .backend import MPSBackend  # noqa: PLC0415

        return MPSBackend
    raise AttributeError(f"module 'mps_backend' has no attribute {name!r}")
