//! Request decoding and response encoding around the generated codecs.
//!
//! The generated decoders trust the lengths they read (an array length becomes a
//! `Vec::with_capacity`), so this module checks what it can before handing bytes over (frame
//! length, header presence, API key and version against [`crate::versions`]) and turns any panic
//! inside a generated decoder into [`WireError::Malformed`]. The binary additionally routes huge
//! allocations through a guard (see `alloc.rs`).

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable};

use crate::beyond::{self, ExpectedBroker, How};
use crate::versions;
use crate::WireError;

/// A decoded request: the header and the typed body.
#[derive(Debug)]
pub struct Request {
    pub header: RequestHeader,
    pub api_key: ApiKey,
    pub body: RequestKind,
    /// ApiVersions v5's cluster and broker the client meant (see [`beyond`]).
    pub expected_broker: Option<ExpectedBroker>,
}

impl Request {
    pub fn version(&self) -> i16 {
        self.header.request_api_version
    }
    pub fn correlation_id(&self) -> i32 {
        self.header.correlation_id
    }
}

/// The fields every request header starts with, readable even when the rest is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderPeek {
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
}

/// Reads api key, version and correlation id from the first 8 bytes of a request frame body.
pub fn peek_header(frame: &[u8]) -> Result<HeaderPeek, WireError> {
    if frame.len() < 8 {
        return Err(WireError::TruncatedHeader { len: frame.len() });
    }
    Ok(HeaderPeek {
        api_key: i16::from_be_bytes([frame[0], frame[1]]),
        api_version: i16::from_be_bytes([frame[2], frame[3]]),
        correlation_id: i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]),
    })
}

/// Decodes one request frame (the bytes after the length prefix). `records` fields stay
/// zero-copy slices of `frame`.
pub fn decode_request(frame: Bytes) -> Result<Request, WireError> {
    let peek = peek_header(&frame)?;
    let api_key = ApiKey::try_from(peek.api_key).map_err(|_| WireError::UnknownApiKey {
        api_key: peek.api_key,
    })?;
    if !versions::is_supported(api_key, peek.api_version) {
        return Err(WireError::UnsupportedVersion {
            api_key: peek.api_key,
            version: peek.api_version,
            correlation_id: peek.correlation_id,
        });
    }
    let malformed = |reason: String| WireError::Malformed {
        api_key: peek.api_key,
        version: peek.api_version,
        reason,
    };
    let decoded = std::panic::catch_unwind(move || {
        let mut buf = frame;
        let header_version = api_key.request_header_version(peek.api_version);
        let header = RequestHeader::decode(&mut buf, header_version)?;
        let version = peek.api_version;
        match beyond::request_how(api_key, version) {
            How::Codec => {
                let body = RequestKind::decode(api_key, &mut buf, version)?;
                Ok::<_, anyhow::Error>((header, body, None))
            }
            How::Twin(twin) => Ok((header, RequestKind::decode(api_key, &mut buf, twin)?, None)),
            How::ByHand => {
                let (body, expected) = beyond::decode_request(api_key, version, &mut buf)
                    .map_err(anyhow::Error::msg)?;
                Ok((header, body, expected))
            }
        }
    });
    match decoded {
        Ok(Ok((header, body, expected_broker))) => Ok(Request {
            header,
            api_key,
            body,
            expected_broker,
        }),
        Ok(Err(e)) => Err(malformed(e.to_string())),
        Err(_) => Err(malformed("decoder panicked".into())),
    }
}

/// Encodes a whole response frame: length prefix, response header, body.
pub fn encode_response(
    correlation_id: i32,
    api_key: ApiKey,
    version: i16,
    body: &ResponseKind,
) -> Result<Bytes, WireError> {
    let header_version = api_key.response_header_version(version);
    let mut out = BytesMut::with_capacity(64);
    out.put_i32(0);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let fail = |e: String| WireError::Malformed {
        api_key: api_key as i16,
        version,
        reason: format!("encoding response: {e}"),
    };
    header
        .encode(&mut out, header_version)
        .map_err(|e| fail(e.to_string()))?;
    match beyond::response_how(api_key, version) {
        How::Codec => body
            .encode(&mut out, version)
            .map_err(|e| fail(e.to_string()))?,
        How::Twin(twin) => body
            .encode(&mut out, twin)
            .map_err(|e| fail(e.to_string()))?,
        How::ByHand => beyond::encode_response(body, version, &mut out)
            .ok_or_else(|| fail(format!("no encoder for {api_key:?} v{version}")))?,
    }
    let len = (out.len() - 4) as i32;
    out[0..4].copy_from_slice(&len.to_be_bytes());
    Ok(out.freeze())
}

/// The answer to an ApiVersions request of a version newer than we know (KIP-511): error
/// UNSUPPORTED_VERSION and our ranges, in a v0 body with a v0 header, which every client reads.
pub fn unsupported_api_versions_response(correlation_id: i32) -> Bytes {
    let body = versions::api_versions_response(
        kafka_protocol::ResponseError::UnsupportedVersion.code(),
        0,
    );
    encode_response(
        correlation_id,
        ApiKey::ApiVersions,
        0,
        &ResponseKind::ApiVersions(body),
    )
    .expect("a v0 ApiVersions response always encodes")
}

/// Encodes a request frame (for clients, tests and the benchmark).
#[cfg(feature = "client")]
pub fn encode_request(header: &RequestHeader, body: &RequestKind) -> Result<Bytes, WireError> {
    let api_key =
        ApiKey::try_from(header.request_api_key).map_err(|_| WireError::UnknownApiKey {
            api_key: header.request_api_key,
        })?;
    let version = header.request_api_version;
    let fail = |e: String| WireError::Malformed {
        api_key: api_key as i16,
        version,
        reason: format!("encoding request: {e}"),
    };
    let mut out = BytesMut::with_capacity(64);
    out.put_i32(0);
    header
        .encode(&mut out, api_key.request_header_version(version))
        .map_err(|e| fail(e.to_string()))?;
    body.encode(&mut out, version)
        .map_err(|e| fail(e.to_string()))?;
    let len = (out.len() - 4) as i32;
    out[0..4].copy_from_slice(&len.to_be_bytes());
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    // The allocator the broker runs with (see `crate::alloc`): the decoders' lying lengths
    // must cost nothing under it.
    #[global_allocator]
    static ALLOCATOR: crate::alloc::GuardedAlloc = crate::alloc::GuardedAlloc;

    // Found by the `request` fuzz target (fuzz/): 14 bytes whose array length made the decoder
    // ask for 13 GB, and with i32::MAX elements for 189 GB, which the kernel refuses and Rust
    // answers by aborting the process. The frame must be refused as malformed, and nothing
    // more.
    #[test]
    fn a_lying_array_length_is_malformed_not_an_abort() {
        for len in [0x0900_0100u32, i32::MAX as u32] {
            let mut frame = vec![0x00, 0x2c, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00];
            frame.extend_from_slice(&len.to_be_bytes());
            let err = decode_request(Bytes::from(frame)).err();
            assert!(
                matches!(err, Some(WireError::Malformed { api_key: 44, .. })),
                "{err:?}"
            );
        }
    }
}
