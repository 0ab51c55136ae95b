//! Heartbeat messages together with the bytes they crossed the wire as.
//!
//! A heartbeat message is signed over its encoding (see `kaas_control::heartbeat::auth`). A
//! receiver that checked the signature over its own re-encoding of what it decoded would refuse
//! every message of a newer kaas with a field it does not know: prost drops unknown fields, so
//! the re-encoding lacks them and the signature no longer matches. Brokers of two versions then
//! could not heartbeat to each other, and a rolling upgrade would stall at the first broker it
//! replaced. So the stream's codec keeps each message's bytes ([`Framed::wire`]), and the
//! signature is checked over those bytes without the signature field ([`split_field`]).
//!
//! The bytes on the wire are the same protobuf message as before; only what is kept on
//! receipt changed, so brokers of the version before this one still interoperate.

use std::marker::PhantomData;

use bytes::{Buf, BufMut, Bytes};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// A message and its encoding: for a received message, the bytes as they arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct Framed<M> {
    pub message: M,
    pub wire: Bytes,
}

impl<M: Message> Framed<M> {
    /// A message to send as its own encoding (unsigned streams, and tests).
    pub fn new(message: M) -> Self {
        let wire = message.encode_to_vec().into();
        Self { message, wire }
    }
}

/// The heartbeat stream's codec: writes [`Framed::wire`] as it is, and decodes a message while
/// keeping its bytes.
#[derive(Debug, Clone)]
pub struct FramedCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for FramedCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for FramedCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = Framed<T>;
    type Decode = Framed<U>;
    type Encoder = FramedEncoder<T>;
    type Decoder = FramedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        FramedEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        FramedDecoder(PhantomData)
    }
}

#[derive(Debug)]
pub struct FramedEncoder<T>(PhantomData<T>);

impl<T: Message> Encoder for FramedEncoder<T> {
    type Item = Framed<T>;
    type Error = Status;

    fn encode(&mut self, item: Framed<T>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put_slice(&item.wire);
        Ok(())
    }
}

#[derive(Debug)]
pub struct FramedDecoder<U>(PhantomData<U>);

impl<U: Message + Default> Decoder for FramedDecoder<U> {
    type Item = Framed<U>;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Framed<U>>, Status> {
        // tonic hands over one whole gRPC message, already bounded by its decoding limit.
        let wire = buf.copy_to_bytes(buf.remaining());
        let message = U::decode(wire.clone())
            .map_err(|e| Status::invalid_argument(format!("bad heartbeat message: {e}")))?;
        Ok(Some(Framed { message, wire }))
    }
}

/// Why [`split_field`] could not walk an encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MalformedWire;

/// Splits a message's encoding into its bytes without top-level field `number` (every
/// occurrence, in order) and the value of that field's last occurrence, protobuf's rule for a
/// repeated scalar field. The field must be length-delimited (a `bytes` signature).
///
/// # Errors
/// [`MalformedWire`] when the bytes are not a sequence of well-formed fields (a truncated
/// value, a group, a reserved wire type), or `number` occurs with another wire type.
pub fn split_field(wire: &[u8], number: u32) -> Result<(Vec<u8>, Option<&[u8]>), MalformedWire> {
    let mut rest = Vec::with_capacity(wire.len());
    let mut value = None;
    let mut at = 0;
    while at < wire.len() {
        let start = at;
        let key = varint(wire, &mut at)?;
        let wire_type = key & 7;
        let field = u32::try_from(key >> 3).map_err(|_| MalformedWire)?;
        let body_start = at;
        match wire_type {
            0 => {
                varint(wire, &mut at)?;
            }
            1 => at = skip(wire, at, 8)?,
            2 => {
                let len = usize::try_from(varint(wire, &mut at)?).map_err(|_| MalformedWire)?;
                at = skip(wire, at, len)?;
            }
            5 => at = skip(wire, at, 4)?,
            _ => return Err(MalformedWire),
        }
        if field == number {
            if wire_type != 2 {
                return Err(MalformedWire);
            }
            // The value follows its length prefix.
            let mut value_start = body_start;
            varint(wire, &mut value_start)?;
            value = Some(&wire[value_start..at]);
        } else {
            rest.extend_from_slice(&wire[start..at]);
        }
    }
    Ok((rest, value))
}

/// Appends field `number` holding `value` (length-delimited) to an encoding.
pub fn append_bytes_field(wire: &mut Vec<u8>, number: u32, value: &[u8]) {
    prost::encoding::bytes::encode(number, &value.to_vec(), wire);
}

fn varint(wire: &[u8], at: &mut usize) -> Result<u64, MalformedWire> {
    let mut slice = wire.get(*at..).ok_or(MalformedWire)?;
    let before = slice.len();
    let v = prost::encoding::decode_varint(&mut slice).map_err(|_| MalformedWire)?;
    *at += before - slice.len();
    Ok(v)
}

fn skip(wire: &[u8], at: usize, len: usize) -> Result<usize, MalformedWire> {
    let end = at.checked_add(len).ok_or(MalformedWire)?;
    if end > wire.len() {
        return Err(MalformedWire);
    }
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heartbeat::BrokerStatus;

    #[test]
    fn splitting_out_a_field_leaves_the_encoding_without_it() {
        let unsigned = BrokerStatus {
            broker_id: 3,
            advertised_host: "kaas-3".into(),
            sequence: 9,
            ..Default::default()
        };
        let signed = BrokerStatus {
            auth: vec![7; 32],
            ..unsigned.clone()
        };
        let wire = signed.encode_to_vec();
        let (rest, value) = split_field(&wire, 13).unwrap();
        assert_eq!(rest, unsigned.encode_to_vec());
        assert_eq!(value, Some(&[7u8; 32][..]));

        let mut appended = unsigned.encode_to_vec();
        append_bytes_field(&mut appended, 13, &[7; 32]);
        assert_eq!(appended, signed.encode_to_vec());
    }

    #[test]
    fn unknown_fields_stay_where_they_were_and_the_last_value_wins() {
        let mut wire = BrokerStatus {
            broker_id: 1,
            ..Default::default()
        }
        .encode_to_vec();
        append_bytes_field(&mut wire, 13, b"first");
        prost::encoding::string::encode(40, &"from a newer kaas".to_owned(), &mut wire);
        prost::encoding::uint64::encode(41, &5, &mut wire);
        append_bytes_field(&mut wire, 13, b"last");
        let (rest, value) = split_field(&wire, 13).unwrap();
        assert_eq!(value, Some(&b"last"[..]));
        let mut expected = BrokerStatus {
            broker_id: 1,
            ..Default::default()
        }
        .encode_to_vec();
        prost::encoding::string::encode(40, &"from a newer kaas".to_owned(), &mut expected);
        prost::encoding::uint64::encode(41, &5, &mut expected);
        assert_eq!(rest, expected);
    }

    #[test]
    fn malformed_encodings_are_refused_not_read_past() {
        for wire in [
            &[0x6a, 0x05, 1, 2][..], // field 13, length 5, two bytes
            &[0x08][..],             // field 1 varint, no value
            &[0x0b][..],             // a group
            &[0x68, 0x01][..],       // field 13 as a varint
            &[
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ][..], // overlong key
            &[0x09, 1, 2, 3][..],    // fixed64 cut short
        ] {
            assert_eq!(split_field(wire, 13), Err(MalformedWire), "{wire:?}");
        }
    }

    proptest::proptest! {
        /// Whatever a status holds, and whatever fields of a newer version follow it, taking
        /// the signature out gives back exactly the bytes that were signed.
        #[test]
        fn the_signed_bytes_come_back_whole(
            broker_id in proptest::prelude::any::<i32>(),
            host in ".{0,40}",
            port in proptest::prelude::any::<u32>(),
            flags in proptest::prelude::any::<(bool, bool)>(),
            sequence in proptest::prelude::any::<u64>(),
            partitions in proptest::collection::vec((".{0,12}", proptest::prelude::any::<i32>()), 0..5),
            auth in proptest::collection::vec(proptest::prelude::any::<u8>(), 1..64),
            newer in proptest::collection::vec((14u32..100_000, proptest::collection::vec(proptest::prelude::any::<u8>(), 0..20)), 0..4),
        ) {
            let unsigned = BrokerStatus {
                broker_id,
                advertised_host: host,
                advertised_port: port,
                healthy: flags.0,
                draining: flags.1,
                sequence,
                partitions: partitions
                    .into_iter()
                    .map(|(topic, partition)| crate::heartbeat::TopicPartition { topic, partition })
                    .collect(),
                ..Default::default()
            };
            let mut extra = Vec::new();
            for (number, value) in &newer {
                append_bytes_field(&mut extra, *number, value);
            }
            let mut signed_bytes = unsigned.encode_to_vec();
            signed_bytes.extend_from_slice(&extra);
            let mut wire = BrokerStatus { auth: auth.clone(), ..unsigned }.encode_to_vec();
            wire.extend_from_slice(&extra);
            let (rest, value) = split_field(&wire, 13).unwrap();
            proptest::prop_assert_eq!(rest, signed_bytes);
            proptest::prop_assert_eq!(value, Some(&auth[..]));
        }

        /// Any bytes at all: refused or split, never read past, and nothing invented.
        #[test]
        fn arbitrary_bytes_never_panic(wire in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            if let Ok((rest, value)) = split_field(&wire, 13) {
                proptest::prop_assert!(rest.len() + value.map_or(0, <[u8]>::len) <= wire.len());
            }
        }
    }
}
