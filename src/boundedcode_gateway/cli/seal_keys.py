"""``seal-key rotate`` and ``seal-key list``: the key ring that signs thinking blocks and
seals reasoning items (fronts/sealing.py), in the configuration's ``data_dir``.

A rotation puts a new key first: it signs and seals from the next start or reload of each
gateway that shares the file, and the keys after it still verify and open until a later
rotation removes them (``--keep``: how many keys the ring holds afterwards, the new one
counted). Only key ids are printed, never a key.
"""

from __future__ import annotations

import sys

from boundedcode_gateway.config import GatewayConfig
from boundedcode_gateway.errors import ConfigError
from boundedcode_gateway.fronts.sealing import KEY_FILE, key_id, read_ring, rotate_ring

EXIT_USAGE = 2


def run_rotate(config: GatewayConfig, keep: int) -> int:
    """Rotate the ring and say which keys it holds now and which went."""
    folder = config.data_path
    if keep < 1:
        print("boundedcode-gateway seal-key rotate: --keep must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    try:
        ring, removed = rotate_ring(folder, keep)
    except (OSError, ValueError, ConfigError) as exc:
        print(f"boundedcode-gateway seal-key rotate: {folder / KEY_FILE}: {exc}", file=sys.stderr)
        return 1
    _print_ring(ring)
    for key in removed:
        print(f"removed key: {key_id(key)}")
    print(
        "# running gateways sign with the new key after a reload (SIGHUP) or restart; what "
        "a removed key signed is refused",
        file=sys.stderr,
    )
    return 0


def run_list(config: GatewayConfig) -> int:
    """The ids of the ring's keys, the signing one first (the ring is made if missing)."""
    folder = config.data_path
    try:
        ring = read_ring(folder)
    except (OSError, ValueError, ConfigError) as exc:
        print(f"boundedcode-gateway seal-key list: {folder / KEY_FILE}: {exc}", file=sys.stderr)
        return 1
    _print_ring(ring)
    return 0


def _print_ring(ring: tuple[bytes, ...]) -> None:
    """The ring's key ids, the signing one first; never a key."""
    print(f"signing key: {key_id(ring[0])}")
    for key in ring[1:]:
        print(f"verifying key: {key_id(key)}")
