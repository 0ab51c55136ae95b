//! A request frame, as a connection hands it to the decoder after the 4-byte length: decoding
//! must never panic past `decode_request` nor take unbounded memory, whatever the bytes, and
//! what it decodes is the API, version and correlation id the connection routed it by.
//! (Re-encoding is not checked: the broker never encodes requests, and kafka-protocol's
//! request encoder is not the inverse of its decoder for every input the decoder accepts.)
#![no_main]

use bytes::Bytes;
use kaas_wire::codec::{decode_request, peek_header};
use libfuzzer_sys::fuzz_target;

// The broker's allocator: a decoder's Vec::with_capacity of a lying array length costs an
// untouched NORESERVE mapping there, not an abort (see kaas_wire::alloc).
#[global_allocator]
static ALLOCATOR: kaas_wire::alloc::GuardedAlloc = kaas_wire::alloc::GuardedAlloc;

thread_local! {
    /// Set while `decode_request` runs: it catches the decoder's panics itself and answers
    /// them as malformed frames (the behaviour under test), so those are not crashes.
    static IN_DECODER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn decode(frame: bytes::Bytes) -> Result<kaas_wire::codec::Request, kaas_wire::error::WireError> {
    IN_DECODER.with(|d| d.set(true));
    let r = decode_request(frame);
    IN_DECODER.with(|d| d.set(false));
    r
}

fuzz_target!(
    init: {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_DECODER.with(|d| d.get()) {
                report(info);
                std::process::abort();
            }
        }));
    },
    |data: &[u8]| {
        let Ok(request) = decode(Bytes::copy_from_slice(data)) else {
            return;
        };
        // What the connection layer routes by (the peek) is what was decoded.
        let peek = peek_header(data).expect("a frame that decoded has a header");
        assert_eq!(request.api_key as i16, peek.api_key);
        assert_eq!(request.header.request_api_version, peek.api_version);
        assert_eq!(request.header.correlation_id, peek.correlation_id);
    }
);
