//! The `consumer` embedded protocol: what a classic consumer puts in its JoinGroup protocols
//! (a Subscription) and what its leader hands out in SyncGroup (an Assignment). The broker
//! never reads these for a classic group, except to report them; it must read and write them
//! when a classic member belongs to a KIP-848 group, where the coordinator is the assignor
//! ([`crate::consumer::ConsumerGroup::classic_join`]).
//!
//! Layouts (Kafka's `ConsumerProtocolSubscription` / `ConsumerProtocolAssignment`, big-endian,
//! non-flexible): a version i16, then
//! - Subscription: topics `[string]`, user data `bytes?`; v1+ owned partitions
//!   `[topic string, partitions [i32]]`; v2+ generation i32; v3+ rack `string?`;
//! - Assignment: partitions `[topic string, partitions [i32]]`, user data `bytes?` (the same
//!   for v0 to v3).
//!
//! A version above 3 is read as 3, as Kafka reads it (later versions only append fields).

use std::collections::BTreeMap;

use bytes::{BufMut, Bytes, BytesMut};

/// The newest layout this reads and writes.
const HIGHEST: i16 = 3;

/// A decoded Subscription.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subscription {
    pub topics: Vec<String>,
    /// Topic name -> partitions the member owns (cooperative members report them; eager ones
    /// revoked everything before joining and report none).
    pub owned: BTreeMap<String, Vec<i32>>,
    pub rack: Option<String>,
}

/// Why embedded protocol bytes could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        let end = self.at.checked_add(n).ok_or(Malformed("length overflow"))?;
        let s = self.b.get(self.at..end).ok_or(Malformed("truncated"))?;
        self.at = end;
        Ok(s)
    }
    fn i16(&mut self) -> Result<i16, Malformed> {
        Ok(i16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn i32(&mut self) -> Result<i32, Malformed> {
        Ok(i32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn nullable_string(&mut self) -> Result<Option<String>, Malformed> {
        let n = self.i16()?;
        if n < 0 {
            return Ok(None);
        }
        let raw = self.take(n as usize)?;
        String::from_utf8(raw.to_vec())
            .map(Some)
            .map_err(|_| Malformed("a string is not UTF-8"))
    }
    fn string(&mut self) -> Result<String, Malformed> {
        self.nullable_string()?.ok_or(Malformed("a null string"))
    }
    /// An array's length; a null array (-1) reads as empty. Bounded by the bytes left, so a
    /// forged count cannot make the caller reserve memory it does not have.
    fn array_len(&mut self, min_item: usize) -> Result<usize, Malformed> {
        let n = self.i32()?;
        if n < 0 {
            return Ok(0);
        }
        let n = n as usize;
        if n.saturating_mul(min_item) > self.b.len() - self.at {
            return Err(Malformed("an array is longer than its bytes"));
        }
        Ok(n)
    }
    fn nullable_bytes(&mut self) -> Result<(), Malformed> {
        let n = self.i32()?;
        if n > 0 {
            self.take(n as usize)?;
        }
        Ok(())
    }
    fn partitions(&mut self) -> Result<BTreeMap<String, Vec<i32>>, Malformed> {
        let mut out: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for _ in 0..self.array_len(6)? {
            let topic = self.string()?;
            let n = self.array_len(4)?;
            let ps = out.entry(topic).or_default();
            for _ in 0..n {
                ps.push(self.i32()?);
            }
        }
        Ok(out)
    }
}

/// The version a member's metadata is written in (its Assignment is answered in the same,
/// capped at 3, as Kafka does). Unreadable metadata counts as version 0.
pub fn version(metadata: &[u8]) -> i16 {
    metadata
        .get(..2)
        .map(|v| i16::from_be_bytes([v[0], v[1]]))
        .unwrap_or(0)
        .clamp(0, HIGHEST)
}

pub fn decode_subscription(metadata: &[u8]) -> Result<Subscription, Malformed> {
    let mut r = Reader { b: metadata, at: 0 };
    let v = r.i16()?;
    if v < 0 {
        return Err(Malformed("a negative version"));
    }
    let mut s = Subscription::default();
    for _ in 0..r.array_len(2)? {
        s.topics.push(r.string()?);
    }
    r.nullable_bytes()?;
    if v >= 1 {
        s.owned = r.partitions()?;
    }
    if v >= 2 {
        r.i32()?;
    }
    if v >= 3 {
        s.rack = r.nullable_string()?;
    }
    Ok(s)
}

/// An Assignment's partitions by topic name; empty bytes are an empty assignment (a member
/// that never got one).
pub fn decode_assignment(bytes: &[u8]) -> Result<BTreeMap<String, Vec<i32>>, Malformed> {
    if bytes.is_empty() {
        return Ok(BTreeMap::new());
    }
    let mut r = Reader { b: bytes, at: 0 };
    if r.i16()? < 0 {
        return Err(Malformed("a negative version"));
    }
    r.partitions()
}

/// An Assignment in `version` (0 to 3 share one layout) with no user data.
pub fn encode_assignment<'a>(
    version: i16,
    partitions: impl IntoIterator<Item = (&'a str, Vec<i32>)>,
) -> Bytes {
    let partitions: Vec<(&str, Vec<i32>)> = partitions.into_iter().collect();
    let mut b = BytesMut::new();
    b.put_i16(version.clamp(0, HIGHEST));
    b.put_i32(partitions.len() as i32);
    for (topic, ps) in partitions {
        b.put_i16(topic.len() as i16);
        b.put_slice(topic.as_bytes());
        b.put_i32(ps.len() as i32);
        for p in ps {
            b.put_i32(p);
        }
    }
    b.put_i32(-1); // no user data
    b.freeze()
}

/// A Subscription in `version` (user data "abc", generation 7), for tests here and of the
/// classic members that send one.
#[cfg(test)]
pub(crate) fn encode_subscription(
    version: i16,
    topics: &[&str],
    owned: &[(&str, &[i32])],
    rack: Option<&str>,
) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(version);
    b.put_i32(topics.len() as i32);
    for t in topics {
        b.put_i16(t.len() as i16);
        b.put_slice(t.as_bytes());
    }
    b.put_i32(3);
    b.put_slice(b"abc"); // user data, skipped
    if version >= 1 {
        b.put_i32(owned.len() as i32);
        for (t, ps) in owned {
            b.put_i16(t.len() as i16);
            b.put_slice(t.as_bytes());
            b.put_i32(ps.len() as i32);
            for p in *ps {
                b.put_i32(*p);
            }
        }
    }
    if version >= 2 {
        b.put_i32(7); // generation
    }
    if version >= 3 {
        match rack {
            Some(r) => {
                b.put_i16(r.len() as i16);
                b.put_slice(r.as_bytes());
            }
            None => b.put_i16(-1),
        }
    }
    b.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subscription_v3(topics: &[&str], owned: &[(&str, &[i32])], rack: Option<&str>) -> Bytes {
        encode_subscription(3, topics, owned, rack)
    }

    #[test]
    fn a_v3_subscription_reads_topics_owned_partitions_and_rack() {
        let m = subscription_v3(&["a", "b"], &[("a", &[0, 2])], Some("r1"));
        let s = decode_subscription(&m).unwrap();
        assert_eq!(s.topics, vec!["a", "b"]);
        assert_eq!(s.owned, BTreeMap::from([("a".to_string(), vec![0, 2])]));
        assert_eq!(s.rack.as_deref(), Some("r1"));
        assert_eq!(version(&m), 3);
    }

    #[test]
    fn a_v0_subscription_has_no_owned_partitions() {
        let mut b = BytesMut::new();
        b.put_i16(0);
        b.put_i32(1);
        b.put_i16(1);
        b.put_slice(b"t");
        b.put_i32(-1);
        let s = decode_subscription(&b).unwrap();
        assert_eq!(s.topics, vec!["t"]);
        assert!(s.owned.is_empty());
    }

    #[test]
    fn an_assignment_round_trips_in_the_members_version() {
        let a = encode_assignment(1, [("t", vec![0, 3]), ("u", vec![1])]);
        assert_eq!(version(&a), 1);
        let back = decode_assignment(&a).unwrap();
        assert_eq!(
            back,
            BTreeMap::from([("t".to_string(), vec![0, 3]), ("u".to_string(), vec![1])])
        );
        assert!(decode_assignment(&[]).unwrap().is_empty());
    }

    #[test]
    fn truncated_or_forged_bytes_are_refused_not_trusted() {
        let m = subscription_v3(&["a"], &[("a", &[0])], None);
        for cut in 0..m.len() {
            assert!(decode_subscription(&m[..cut]).is_err(), "cut at {cut}");
        }
        // A count of 2^31-1 topics in six bytes.
        let forged = [0u8, 0, 0x7f, 0xff, 0xff, 0xff];
        assert!(decode_subscription(&forged).is_err());
        assert!(decode_assignment(&forged).is_err());
    }
}
