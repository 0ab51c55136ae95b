//! Framing: every Kafka request and response is a 4-byte big-endian length and that many bytes.

use crate::WireError;

/// Bytes in the length prefix of every frame.
pub const FRAME_PREFIX_LEN: usize = 4;

/// The default limit on a request frame, as Kafka's `socket.request.max.bytes` (100 MiB).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 100 * 1024 * 1024;

/// Reads the length prefix and checks it against `max_frame_bytes` *before* anything is
/// allocated for the body, so a lying length field costs nothing.
pub fn frame_len(
    prefix: [u8; FRAME_PREFIX_LEN],
    max_frame_bytes: usize,
) -> Result<usize, WireError> {
    let len = i32::from_be_bytes(prefix);
    if len <= 0 {
        return Err(WireError::BadFrameLength { len });
    }
    let len = len as usize;
    if len > max_frame_bytes {
        return Err(WireError::FrameTooLarge {
            len,
            max: max_frame_bytes,
        });
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    // A frame length is accepted only when positive and within the limit.
    #[test]
    fn bounds() {
        assert_eq!(frame_len(10i32.to_be_bytes(), 100), Ok(10));
        assert_eq!(
            frame_len(0i32.to_be_bytes(), 100),
            Err(WireError::BadFrameLength { len: 0 })
        );
        assert_eq!(
            frame_len((-5i32).to_be_bytes(), 100),
            Err(WireError::BadFrameLength { len: -5 })
        );
        assert_eq!(
            frame_len(101i32.to_be_bytes(), 100),
            Err(WireError::FrameTooLarge { len: 101, max: 100 })
        );
    }
}
