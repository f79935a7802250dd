"""MP00 serialization: schema, generated bindings, blob writer and validating reader."""

from .errors import MPSFormatError
from .model import Blob, DataType, Graph, Header, Node, OpType, Tensor
from .reader import read_blob as _read
from .writer import write_blob


def read_blob(data):
    """Decode and validate one MP00 blob; raises MPSFormatError on any violation."""
    return _read(data)


__all__ = ["Blob", "DataType", "Graph", "Header", "MPSFormatError", "Node", "OpType", "Tensor", "read_blob", "write_blob"]
