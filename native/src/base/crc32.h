/* CRC-32 (zlib's: IEEE 802.3 polynomial, reflected, init and final xor 0xFFFFFFFF), the checksum of
 * every .pi2 section. Python writes it with zlib.crc32, so both sides agree by construction. */
#ifndef PI2_CRC32_H
#define PI2_CRC32_H

#include <stddef.h>
#include <stdint.h>

/* Continue a running CRC (start with 0), as zlib.crc32(data, crc) does. */
uint32_t pi2_crc32(uint32_t crc, const void *data, size_t len);

#endif
