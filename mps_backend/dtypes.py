"""torch dtype <-> MPSDataType, and which dtypes the device can hold (semantics §3.1)."""

from __future__ import annotations

import torch

from mps_backend.serialization.model import DataType

TORCH_TO_MPS: dict[torch.dtype, DataType] = {
    torch.float16: DataType.float16,
    torch.float32: DataType.float32,
    torch.int8: DataType.int8,
    torch.int16: DataType.int16,
    torch.int32: DataType.int32,
    torch.int64: DataType.int64,
    torch.bool: DataType.bool,
}
DEVICE_DTYPES = frozenset(TORCH_TO_MPS)
FLOAT_DTYPES = frozenset({torch.float16, torch.float32})


_MPS_TO_TORCH = {v: k for k, v in TORCH_TO_MPS.items()}


def torch_dtype(dtype: DataType) -> torch.dtype:
    """The torch dtype of a device dtype (int4 has none: ValueError)."""
    try:
        return _MPS_TO_TORCH[dtype]
    except KeyError:
        raise ValueError(f"device dtype {dtype!r} has no torch dtype") from None


def mps_dtype(dtype: torch.dtype) -> DataType:
    try:
        return TORCH_TO_MPS[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} has no MPS device type") from None


def dtype_reason(dtype: torch.dtype) -> str | None:
    """Why a tensor of ``dtype`` cannot live on the device, or None when it can."""
    if dtype in DEVICE_DTYPES:
        return None
    if dtype == torch.float64:
        return "float64 tensors: the device computes float64 as float32 (convert the model to float32)"
    if dtype == torch.uint8:
        return "uint8 tensors: the MPS runtime aborts on uint8 ('Invalid MPS data type')"
    if dtype == torch.bfloat16:
        return "bfloat16 tensors: the MPS runtime aborts on bfloat16 ('Invalid MPS data type')"
    return f"{dtype} tensors are not supported by the MPS runtime"
