//! Kafka's zig-zag varints (the record format's lengths, deltas and keys' sizes), one codec for
//! every crate that walks records: compaction, the offset log, the benchmark's builder.
//!
//! The one overflow rule: a varint is at most 10 bytes (64 bits in 7-bit groups); a longer one
//! is malformed, as Kafka's `ByteUtils.readVarlong` says. Bits past the 64th in the tenth byte
//! are dropped, which is what Kafka's decoder does too.

/// Longest encoding of a 64-bit varint.
pub const MAX_VARINT_LEN: usize = 10;

/// Appends the zig-zag varint encoding of `v`.
pub fn put_varint(out: &mut impl bytes::BufMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.put_u8((z as u8) | 0x80);
        z >>= 7;
    }
    out.put_u8(z as u8);
}

/// Appends the unsigned varint encoding of `v` (no zig-zag): the protocol's compact lengths and
/// tagged-field counts.
pub fn put_uvarint(out: &mut impl bytes::BufMut, mut v: u64) {
    while v >= 0x80 {
        out.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    out.put_u8(v as u8);
}

/// Bytes [`put_varint`] writes for `v`.
pub fn varint_len(v: i64) -> usize {
    let z = ((v << 1) ^ (v >> 63)) as u64;
    let bits = 64 - (z | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Reads a zig-zag varint from `b` at `*at`, advancing `*at` past it. `None` if it runs past
/// the end of `b` or is longer than [`MAX_VARINT_LEN`] bytes (then `*at` is unspecified).
pub fn read_varint(b: &[u8], at: &mut usize) -> Option<i64> {
    let mut z: u64 = 0;
    for i in 0..MAX_VARINT_LEN {
        let byte = *b.get(*at)?;
        *at += 1;
        z |= ((byte & 0x7f) as u64) << (7 * i);
        if byte & 0x80 == 0 {
            return Some(((z >> 1) as i64) ^ -((z & 1) as i64));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        // Every i64 survives the round trip, and the length the builder reserves is exact.
        #[test]
        fn round_trip(v in any::<i64>()) {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            prop_assert_eq!(out.len(), varint_len(v));
            let mut at = 0;
            prop_assert_eq!(read_varint(&out, &mut at), Some(v));
            prop_assert_eq!(at, out.len());
        }

        // A truncated varint is never read as a value.
        #[test]
        fn truncated_is_none(v in any::<i64>()) {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            let mut at = 0;
            prop_assert_eq!(read_varint(&out[..out.len() - 1], &mut at), None);
        }
    }

    // Zig-zag maps 0, -1, 1, -2 to 0, 1, 2, 3; 150 becomes 300, which is 0xac 0x02.
    #[test]
    fn known_encodings() {
        for (v, want) in [
            (0i64, &[0u8][..]),
            (-1, &[1]),
            (1, &[2]),
            (-2, &[3]),
            (150, &[0xac, 0x02]),
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out, want, "{v}");
        }
    }

    // Eleven continuation bytes are malformed, not a wrapped-around number.
    #[test]
    fn longer_than_ten_bytes_is_malformed() {
        let b = [0xffu8; 11];
        assert_eq!(read_varint(&b, &mut 0), None);
        let mut ten = vec![0xffu8; 9];
        ten.push(0x01);
        assert_eq!(read_varint(&ten, &mut 0), Some(i64::MIN));
    }
}
