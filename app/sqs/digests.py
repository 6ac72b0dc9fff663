"""The MD5 digests SQS answers with and the SDKs verify: of a body, and of message attributes."""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Mapping
from typing import Any


def md5_of_body(body: str) -> str:
    return hashlib.md5(body.encode(), usedforsecurity=False).hexdigest()


def md5_of_attributes(attributes: Mapping[str, Mapping[str, Any]]) -> str:
    """AWS's algorithm: for each attribute in name order, the name, the data type (each as a 4-byte
    big-endian length then UTF-8), one transport byte (1: String and Number, 2: Binary), then the value as
    length and bytes (a string's UTF-8, a binary's decoded bytes)."""
    out = bytearray()
    for name in sorted(attributes):
        value = attributes[name]
        data_type = str(value["DataType"])
        _field(out, name.encode())
        _field(out, data_type.encode())
        if data_type.startswith("Binary"):
            out.append(2)
            _field(out, base64.b64decode(value["BinaryValue"]))
        else:
            out.append(1)
            _field(out, str(value["StringValue"]).encode())
    return hashlib.md5(bytes(out), usedforsecurity=False).hexdigest()


def _field(out: bytearray, raw: bytes) -> None:
    out += struct.pack(">I", len(raw))
    out += raw
