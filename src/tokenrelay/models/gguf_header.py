"""The few facts of a GGUF file that are needed before it is loaded: its architecture, trained context and the
shape of its KV cache, read from the file's header; and the type of each of its weights.

Written by hand because the `gguf` package's reader parses every tensor and every token of the vocabulary up
front (seconds for a 262k-token vocabulary); this skips arrays unread, and reads the tensor section only when asked.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# GGUF value types (the format's spec): fixed-size scalars by struct code, then string (8), array (9).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class NotGguf(ValueError):
    """The file is not a GGUF model (or is cut short)."""


@dataclass(frozen=True, slots=True)
class GgufFacts:
    architecture: str
    file_bytes: int
    context_length: int | None
    layers: int
    kv_values_per_token: int  # keys and values of one token across one layer, in elements

    def kv_bytes(self, cells: int, bytes_per_value: float) -> int:
        return int(cells * self.layers * self.kv_values_per_token * bytes_per_value)


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    ggml_type: int
    shape: tuple[int, ...]  # ggml's order: a matrix's row length first, then its rows (a weight's output features)


def read_facts(path: Path) -> GgufFacts:
    meta, _ = _read(path, tensors=False)
    arch = str(meta.get("general.architecture", ""))

    def number(key: str, default: int = 0) -> int:
        value = meta.get(f"{arch}.{key}", default)
        return int(value) if isinstance(value, int | float) else default

    embedding = number("embedding_length")
    heads = number("attention.head_count", 1) or 1
    heads_kv = number("attention.head_count_kv", heads) or heads
    key_length = number("attention.key_length", embedding // heads)
    value_length = number("attention.value_length", embedding // heads)
    context = number("context_length") or None
    return GgufFacts(arch, path.stat().st_size, context, number("block_count"), heads_kv * (key_length + value_length))


def read_tensors(path: Path) -> list[TensorInfo]:
    """The file's weights: name, ggml type and shape, from the tensor section that follows the key-value one."""
    _, tensors = _read(path, tensors=True)
    return tensors


def _read(path: Path, tensors: bool) -> tuple[dict[str, Any], list[TensorInfo]]:
    with path.open("rb") as file:
        if path.stat().st_size < 24:
            raise NotGguf(f"{path} is not a GGUF file")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if data[:4] != b"GGUF":
                raise NotGguf(f"{path} is not a GGUF file")
            try:
                meta, offset = _metadata(data)
                return meta, _tensors(data, offset) if tensors else []
            except (struct.error, IndexError, UnicodeDecodeError) as exc:
                raise NotGguf(f"{path}: its GGUF header cannot be read ({exc})") from exc


def _metadata(data: mmap.mmap) -> tuple[dict[str, Any], int]:
    """The key-value section, and the offset where the tensor section starts."""
    _version, _tensors, count = struct.unpack_from("<IQQ", data, 4)
    offset = 24
    meta: dict[str, Any] = {}
    for _ in range(count):
        key, offset = _string(data, offset)
        (kind,) = struct.unpack_from("<I", data, offset)
        value, offset = _value(data, offset + 4, kind)
        meta[key] = value
    return meta, offset


def _tensors(data: mmap.mmap, offset: int) -> list[TensorInfo]:
    _version, count = struct.unpack_from("<IQ", data, 4)
    tensors = []
    for _ in range(count):
        name, offset = _string(data, offset)
        (dims,) = struct.unpack_from("<I", data, offset)
        shape = struct.unpack_from(f"<{dims}Q", data, offset + 4)
        offset += 4 + 8 * dims
        (kind,) = struct.unpack_from("<I", data, offset)
        offset += 4 + 8  # the type, then the data's offset
        tensors.append(TensorInfo(name, kind, tuple(shape)))
    return tensors


def _string(data: mmap.mmap, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", data, offset)
    start = offset + 8
    return data[start : start + length].decode("utf-8", errors="replace"), start + length


def _value(data: mmap.mmap, offset: int, kind: int) -> tuple[Any, int]:
    if kind in _SCALARS:
        code = "<" + _SCALARS[kind]
        return struct.unpack_from(code, data, offset)[0], offset + struct.calcsize(code)
    if kind == _STRING:
        return _string(data, offset)
    if kind != _ARRAY:
        raise struct.error(f"unknown GGUF value type {kind}")
    element, length = struct.unpack_from("<IQ", data, offset)
    offset += 12
    if element in _SCALARS:  # skipped unread: only scalars are needed here
        return None, offset + length * struct.calcsize("<" + _SCALARS[element])
    for _ in range(length):
        _, offset = _value(data, offset, element)
    return None, offset
