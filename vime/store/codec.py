"""Binary codec for per-token columns: compact, fixed-width, little-endian on every host.

Why not JSON: a 4,096-token response is ~25 KB of JSON per list and slow to parse; as binary
it is 16 KB of tokens (int32), 4 KB of loss mask (uint8) and 16 KB of log-probs (float32),
decoded with one `frombytes`. Invariants, for `n` entries:

- token ids: `4 * n` bytes, int32 little-endian (vocabularies stay far below 2**31);
- loss mask: `n` bytes, uint8 (0 or 1 in practice; any value 0..255 round-trips);
- log-probs: `4 * n` bytes, float32 little-endian; a float64 comes back rounded to float32.

Standard library only (`array`), so the store never pulls torch in.
"""

from __future__ import annotations

import array
import sys
from collections.abc import Sequence

from vime.errors import ConfigError

_INT32 = next(code for code in ("i", "l") if array.array(code).itemsize == 4)
_FLOAT32 = "f"
_SWAP = sys.byteorder != "little"


def encode_int32(values: Sequence[int], *, name: str = "token ids") -> bytes:
    """Pack integer ids as int32 little-endian; `name` labels the field in errors."""
    try:
        packed = array.array(_INT32, values)
    except (OverflowError, TypeError) as exc:
        raise ConfigError(f"{name}: cannot store as int32 ({exc}); token ids must be ints in [0, 2**31)") from None
    if _SWAP:
        packed.byteswap()
    return packed.tobytes()


def decode_int32(data: bytes) -> list[int]:
    return _decode(_INT32, data)


def encode_uint8(values: Sequence[int], *, name: str = "loss_mask") -> bytes:
    """Pack small ints (a loss mask) one byte each."""
    try:
        return bytes(values)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{name}: cannot store as uint8 ({exc}); loss_mask entries must be 0 or 1") from None


def decode_uint8(data: bytes) -> list[int]:
    return list(data)


def encode_float32(values: Sequence[float], *, name: str = "log_probs") -> bytes:
    """Pack floats as float32 little-endian (vLLM reports log-probs in float32 anyway)."""
    try:
        packed = array.array(_FLOAT32, values)
    except (OverflowError, TypeError) as exc:
        raise ConfigError(f"{name}: cannot store as float32 ({exc}); log-probs must be floats") from None
    if _SWAP:
        packed.byteswap()
    return packed.tobytes()


def decode_float32(data: bytes) -> list[float]:
    return _decode(_FLOAT32, data)


def _decode(code: str, data: bytes) -> list:
    unpacked = array.array(code)
    unpacked.frombytes(data)
    if _SWAP:
        unpacked.byteswap()
    return unpacked.tolist()


def encode_optional(encode, values, *, name: str) -> bytes | None:
    """`None` stays `None` (a sample without a loss mask is not one with an empty mask)."""
    return None if values is None else encode(values, name=name)


def decode_optional(decode, data: bytes | None) -> list | None:
    return None if data is None else decode(data)
