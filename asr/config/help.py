"""`python -m asr.train --help`: every key of the typed schema with its type, default and description.

The descriptions are the schema's own comments (asr/config/schema.py, DataConfig in asr/data/config.py):
the comment on a field's line, or else the comment lines right above it. One source
of truth: the same text a reader of the schema sees. tests/asr/test_config_help.py requires one for
every field.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import textwrap
import tokenize
import typing
from functools import cache


# attention is an open node (its keys depend on the attention), so it is described as a whole
ATTENTION_HELP = ("the attention of every encoder layer: attention=NAME (full, shared_full, lsh, clustered, "
                  "iclustered, ...) and attention.OPTION=VALUE; conf/attention/ lists each one's options")


@cache
def field_descriptions(schema: type) -> dict[str, str]:
    """{field name: its comment} from the dataclass's source."""
    source = textwrap.dedent(inspect.getsource(schema))
    lines = source.splitlines()
    comments = {token.start[0]: token.string.lstrip("#").strip()
                for token in tokenize.generate_tokens(io.StringIO(source).readline)
                if token.type == tokenize.COMMENT}
    descriptions = {}
    for node in ast.parse(source).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        line = node.lineno
        if line in comments and lines[line - 1].split("#")[0].strip():   # a comment after the code
            descriptions[node.target.id] = comments[line]
            continue
        above = []
        previous = line - 1
        while previous in comments and not lines[previous - 1].split("#")[0].strip():
            above.insert(0, comments[previous])
            previous -= 1
        if above:
            descriptions[node.target.id] = " ".join(above)
    return descriptions


def schema_keys(schema: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for every leaf key of `schema`, nested sections flattened."""
    rows = []
    hints = typing.get_type_hints(schema)
    descriptions = field_descriptions(schema)
    for field in dataclasses.fields(schema):
        key = prefix + field.name
        kind = hints[field.name]
        if dataclasses.is_dataclass(kind):
            rows += schema_keys(kind, key + ".")
            continue
        if field.name == "attention" and not prefix:
            rows.append((key, "group", "full", ATTENTION_HELP))
            continue
        default = (field.default_factory() if field.default_factory is not dataclasses.MISSING
                   else field.default)
        rows.append((key, type_name(kind), json.dumps(default), descriptions.get(field.name, "")))
    return rows


def type_name(kind) -> str:
    if typing.get_origin(kind) is typing.Union:
        inner = [type_name(arg) for arg in typing.get_args(kind) if arg is not type(None)]
        return " | ".join(inner) + " | null"
    if typing.get_origin(kind) in (list, typing.List):
        return f"list[{type_name(typing.get_args(kind)[0])}]"
    if typing.get_origin(kind) in (dict, typing.Dict):
        return "dict"
    return "any" if kind is typing.Any else getattr(kind, "__name__", str(kind))


def schema_help() -> str:
    """The key table of --help (Hydra's help template calls this through the asr_schema_help resolver)."""
    from asr.config.schema import TrainConfig

    lines = []
    for key, kind, default, description in schema_keys(TrainConfig):
        lines.append(f"  {key} ({kind}, default {default}): {description}")
    return "\n".join(lines)
