"""The header of a GGUF file: its metadata and tensor table, without the weights.

Plain Python (the `gguf` package only for its table of quantization block
sizes). The model library stores what it finds on the model's row
(modelmeta.read_gguf) and preflight sizes the weights and KV cache from it.
"""
from __future__ import annotations

import math
import os
import struct
from typing import Any


class GGUFError(ValueError):
    """The file cannot be read or is not a GGUF file; the message names it."""


SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
BIG_ARRAY = 4096      # longer arrays (tokenizer vocabularies) are skipped, not decoded


def read_gguf_header(path: str | os.PathLike) -> tuple[dict, list[dict]]:
    """Read a .gguf file's metadata and tensor list without touching the tensor data.

    Returns (metadata dict, [{"name", "type", "shape", "n_elements", "n_bytes"}...]).
    Long arrays (the tokenizer's 262k-entry vocabulary) are skipped: decoding them
    with gguf.GGUFReader takes half a minute on a small CPU, and the fit needs none of it.
    """
    try:
        with open(path, "rb") as f:
            return _read(f)
    except OSError as exc:
        raise GGUFError(f"cannot read GGUF file {path}: {exc}") from exc
    except (struct.error, UnicodeDecodeError, KeyError) as exc:
        raise GGUFError(f"{path} is not a valid GGUF file ({exc})") from exc


def _read(f) -> tuple[dict, list[dict]]:
    def unpack(fmt):
        size = struct.calcsize(fmt)
        data = f.read(size)
        if len(data) < size:
            raise struct.error("file ends inside the header")
        return struct.unpack(fmt, data)[0]

    def string():
        return f.read(unpack("<Q")).decode("utf-8", errors="replace")

    def value(vtype):
        if vtype in SCALARS:
            return unpack(SCALARS[vtype])
        if vtype == STRING:
            return string()
        if vtype == ARRAY:
            itype, count = unpack("<I"), unpack("<Q")
            if count > BIG_ARRAY:
                if itype in SCALARS:
                    f.seek(count * struct.calcsize(SCALARS[itype]), 1)
                else:
                    for _ in range(count):
                        value(itype)
                return None
            return [value(itype) for _ in range(count)]
        raise KeyError(f"unknown GGUF value type {vtype}")

    if f.read(4) != b"GGUF":
        raise GGUFError("not a GGUF file (no GGUF magic at the start)")
    version = unpack("<I")
    if version < 2:
        raise GGUFError(f"GGUF version {version} is too old; convert the file with a current llama.cpp")
    n_tensors, n_kv = unpack("<Q"), unpack("<Q")
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = string()
        v = value(unpack("<I"))
        if v is not None:
            meta[key] = v
    try:
        import gguf

        sizes = {int(k): v for k, v in gguf.GGML_QUANT_SIZES.items()}
        names = {int(t): t.name for t in gguf.GGMLQuantizationType}
    except ImportError:     # the common types, (block size, bytes per block)
        sizes = {0: (1, 4), 1: (1, 2), 8: (32, 34), 12: (256, 144), 14: (256, 210), 30: (1, 2)}
        names = {}
    tensors = []
    for _ in range(n_tensors):
        name = string()
        dims = [unpack("<Q") for _ in range(unpack("<I"))]
        ttype = unpack("<I")
        unpack("<Q")    # offset into the data section
        n = math.prod(dims)
        block, type_size = sizes.get(ttype, (1, 0))
        tensors.append({"name": name, "type": names.get(ttype, str(ttype)), "shape": dims,
                        "n_elements": n, "n_bytes": n // block * type_size})
    # where tensor data starts: the header's end, padded to the file's alignment
    align = int(meta.get("general.alignment", 32))
    meta["GGUF.data_offset"] = -(-f.tell() // align) * align
    return meta, tensors
