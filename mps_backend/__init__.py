"""mps_backend: lower PyTorch models to the ExecuTorch MPS delegate.

    from mps_backend import MPSPartitioner
    edge = to_edge_transform_and_lower(torch.export.export(model, args), partitioner=[MPSPartitioner()])

Importing this package has no side effects; the partitioner and backend load on first use.
"""
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
