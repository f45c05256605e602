/*
 * crc32c.h - CRC-32C (Castagnoli) of a buffer: the end-to-end checksum of
 * CHORUS_CHECKSUM. SSE4.2's crc32 instruction, three streams interleaved,
 * when the CPU has it; a table otherwise.
 */
#ifndef CHORUS_CRC32C_H
#define CHORUS_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t crc32c(const void *buf, size_t len);

#endif
