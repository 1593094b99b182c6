"""st_io.py — a minimal safetensors reader/writer (standard library + numpy only).

Format: 8-byte little-endian header length N, then N bytes of JSON
{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}
padded with spaces to a multiple of 8, then the raw little-endian tensor data (offsets relative to
the end of the header).
"""
import json
import struct

import numpy as np

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8,
    "BOOL": np.bool_,
}
_NAMES = {np.dtype(v).newbyteorder("<"): k for k, v in _DTYPES.items()}


def dtype_code(dt):
    dt = np.dtype(dt).newbyteorder("<")
    if dt not in _NAMES:
        raise ValueError(f"dtype {dt} has no safetensors code")
    return _NAMES[dt]


def encode(tensors, metadata=None, dtype_override=None):
    """Returns the bytes of a safetensors file. tensors: {name: array-like}.
    dtype_override: {name: code} writes that code in the header instead of the real one (tests)."""
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, arr in tensors.items():
        a = np.ascontiguousarray(np.asarray(arr))
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        raw = a.tobytes()
        code = (dtype_override or {}).get(name, dtype_code(a.dtype))
        header[name] = {"dtype": code, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((-len(hj)) % 8)
    return struct.pack("<Q", len(hj)) + hj + b"".join(chunks)


def save(path, tensors, metadata=None):
    with open(path, "wb") as f:
        f.write(encode(tensors, metadata))


def decode(data):
    """Returns ({name: np.ndarray}, metadata) from the bytes of a safetensors file."""
    if len(data) < 8:
        raise ValueError("safetensors file shorter than 8 bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError("safetensors header runs past the end of the file")
    header = json.loads(data[8:8 + n].decode())
    meta = header.pop("__metadata__", {}) or {}
    body = memoryview(data)[8 + n:]
    out = {}
    for name, info in header.items():
        dt = np.dtype(_DTYPES[info["dtype"]]).newbyteorder("<")
        b, e = info["data_offsets"]
        if not (0 <= b <= e <= len(body)):
            raise ValueError(f"tensor {name}: data offsets out of range")
        shape = tuple(info["shape"])
        count = int(np.prod(shape)) if shape else 1
        if count * dt.itemsize != e - b:
            raise ValueError(f"tensor {name}: {e - b} bytes for shape {shape} {info['dtype']}")
        out[name] = np.frombuffer(body[b:e], dtype=dt).reshape(shape).copy()
    return out, meta


def load(path):
    with open(path, "rb") as f:
        return decode(f.read())[0]
