"""Compressed payloads in the store: what is written behind a mark, and how it is read
back without trusting it (pure: no I/O)."""

from __future__ import annotations

import zlib

# A closed membership is stored compressed, behind this mark; a million members of
# about 150 bytes each inflate to well under MAX_MEMBERSHIP_BYTES.
COMPRESSED = b"\x00zlib:"
MAX_MEMBERSHIP_BYTES = 256 << 20


def inflated(payload: bytes | str, error: type[ValueError]) -> bytes | str:
    """A compressed payload's contents, refusing (with `error`) more than
    MAX_MEMBERSHIP_BYTES of them (a forged payload that inflates without end) or a
    payload that is not whole; anything without the mark as it is."""
    if isinstance(payload, str) or not payload.startswith(COMPRESSED):
        return payload
    inflater = zlib.decompressobj()
    try:
        text = inflater.decompress(payload[len(COMPRESSED) :], MAX_MEMBERSHIP_BYTES)
    except zlib.error:
        raise error("membership: not a valid compressed payload") from None
    if inflater.unconsumed_tail or not inflater.eof:
        raise error(f"membership: truncated, or over {MAX_MEMBERSHIP_BYTES} bytes uncompressed")
    return text
