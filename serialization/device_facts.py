"""What the device (the MPS delegate runtime of executorch 1.0-1.4) accepts, in one place.

Used by the builder (refuses node kinds the runtime cannot dispatch), the validating reader, ``simplify``
(which fields define and which read values), the device model's checks and the tests. The section
numbers refer to docs/device-semantics.md.
"""

from __future__ import annotations

from .model import DataType

#: serialized data types the device can create placeholders/constants of (§3.1); the rest abort at init. The
#: torch dtypes the lowering emits are ``mps_backend.dtypes.DEVICE_DTYPES`` (a subset, as torch dtypes)
DEVICE_DATATYPES = frozenset(
    {
        DataType.float16,
        DataType.float32,
        DataType.float64,
        DataType.int4,
        DataType.int8,
        DataType.int16,
        DataType.int32,
        DataType.int64,
        DataType.bool,
    }
)
#: union members the runtime has no dispatch case for (§2.7): a graph with one fails to build
NOT_DISPATCHED = frozenset({"MPSMin", "MPSMax", "MPSAtan2"})
#: members whose result is bool whatever their operands' dtype (§5.2)
BOOL_RESULT = frozenset({"MPSEq", "MPSNe", "MPSGe", "MPSGt", "MPSLe", "MPSLt"})
#: fields with a neutral value the node-emission API writes when a lowering leaves them out (every
#: other field must be given): alpha scales the second operand of MPSAdd/MPSSub (1.0 = plain
#: add/sub); an absent rounding_mode is true division / the plain remainder (§5.2)
NEUTRAL_FIELDS: dict[tuple[str, str], object] = {
    ("MPSAdd", "alpha"): 1.0,
    ("MPSSub", "alpha"): 1.0,
    ("MPSDiv", "rounding_mode"): None,
    ("MPSFmod", "rounding_mode"): None,
    ("MPSRemainder", "rounding_mode"): None,
}
#: fields of a node that define values (everything else ending in _id/_ids reads one)
OUTPUT_FIELDS = frozenset({"output_id", "output_ids", "output1_id", "output2_id", "output3_id"})
#: (member, field): -1 means "absent" (conv bias, §5.12)
OPTIONAL_INPUTS = frozenset({("MPSConv2D", "input3_id"), ("MPSDepthwiseConv2D", "input3_id")})
#: (member, vector field): -1 entries mean "no index on this axis" (§5.9)
OPTIONAL_INPUT_ENTRIES = frozenset({("MPSIndexTensor", "indices_id"), ("MPSIndexPut", "indices_id")})
#: (member, id field) the runtime never reads or never writes: -1 or any in-range id is accepted
#: and an "output" listed here is not defined by the node (BatchNorm output3 is never set, §5.13)
IGNORED_IDS = frozenset(
    {
        ("MPSReLU", "input2_id"),
        ("MPSFull", "input1_id"),
        ("MPSAvgPool2D", "output2_id"),
        ("MPSBatchNorm", "output3_id"),
        ("MPSDequantizePerChannelGroup", "zero_points_id"),
    }
)
#: (member, field) vectors/strings that may be absent (everything else is read without a null check)
NULLABLE = frozenset(
    {("MPSDiv", "rounding_mode"), ("MPSFmod", "rounding_mode"), ("MPSRemainder", "rounding_mode"), ("MPSFullLike", "shape")}
)


def is_value_field(name: str) -> bool:
    """Whether a node field holds value ids (read or defined)."""
    return name.endswith(("_id", "_ids"))


def node_value_ids(fields: dict, outputs: bool) -> list[int]:
    """The value ids a node defines (``outputs``) or reads, in field order (vectors flattened); outputs
    in the order of their names (``output1_id`` first: the schema puts ``output2_id`` before it in
    MPSLayerNorm and MPSBatchNorm, whose main result is ``output1_id``)."""
    ids: list[int] = []
    for name, value in sorted(fields.items()) if outputs else fields.items():
        if not is_value_field(name) or (name in OUTPUT_FIELDS) != outputs:
            continue
        ids.extend(v for v in (value if isinstance(value, list) else (value,)) if isinstance(v, int))
    return ids
