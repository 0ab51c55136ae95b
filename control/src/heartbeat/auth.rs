//! Who may speak on the heartbeat channel: every message is signed with HMAC-SHA256.
//!
//! Runs on the control thread (signing and checking are a few microseconds per message, once a
//! second per broker). Without it, anyone who could reach a controller's heartbeat port could
//! register a broker with any address and have partitions assigned to it, or speak as a real
//! broker (draining, a different host) and move its partitions away.
//!
//! # Keys
//!
//! The cluster key is 32 random bytes shared by the brokers of one cluster: by default the file
//! `__cluster/heartbeat.key` on the shared data volume, created by the first broker (the volume
//! is already what a broker trusts: whoever can write it can change any log), or the file given
//! by `--cluster-key-file` (a Kubernetes Secret, for instance). Each broker signs with its own
//! key, derived from the cluster key and its id, so a status signed as broker N is refused when
//! it claims to be broker M, and a controller's message for broker N is refused by broker M.
//! What a shared key cannot give: a broker that holds the cluster key can derive every other
//! broker's key. Binding an id to a credential the other brokers do not hold needs per-broker
//! certificates (mutual TLS), which this does not do.
//!
//! # Replay
//!
//! A status carries its send time and is refused more than [`MAX_CLOCK_SKEW`] away from the
//! controller's clock, so a recorded status cannot be replayed later; within that window a
//! replay repeats what the broker itself said. A controller's acknowledgement names the status
//! sequence it acknowledges, and a broker opens its write fence from the time it *sent* that
//! status, so a replayed old acknowledgement opens nothing.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kaas_proto::framed::{append_bytes_field, split_field, Framed};
use kaas_proto::heartbeat::{BrokerStatus, ControllerMessage};
use prost::Message;
use ring::hmac;
use ring::rand::SecureRandom;

/// The cluster key's file on the shared volume (when `--cluster-key-file` is not given).
pub const KEY_FILE: &str = "heartbeat.key";
/// Length of a generated cluster key.
const KEY_BYTES: usize = 32;
/// Shortest cluster key accepted from a file.
const MIN_KEY_BYTES: usize = 16;
/// How far a status's send time may be from the controller's clock.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(30);

/// Heartbeat streams or messages refused for a bad or missing signature, since start
/// (`kaas_heartbeat_refused_total`).
pub static REFUSED: AtomicU64 = AtomicU64::new(0);

/// Counts a refusal and logs it, at most one line per 10 s (a stranger retrying in a loop
/// must not flood the log), with the number suppressed meanwhile.
pub fn refused(what: &str) {
    static LAST_LOG_S: AtomicU64 = AtomicU64::new(0);
    static SUPPRESSED: AtomicU64 = AtomicU64::new(0);
    REFUSED.fetch_add(1, Ordering::Relaxed);
    let now_s = now_unix_ms() / 1000;
    let last = LAST_LOG_S.load(Ordering::Relaxed);
    if now_s >= last + 10
        && LAST_LOG_S
            .compare_exchange(last, now_s, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        let suppressed = SUPPRESSED.swap(0, Ordering::Relaxed);
        tracing::warn!(suppressed, "{what} (every broker of a cluster must use the same cluster key: __cluster/heartbeat.key on the shared volume, or --cluster-key-file)");
    } else {
        SUPPRESSED.fetch_add(1, Ordering::Relaxed);
    }
}

/// The cluster key (see the module docs).
#[derive(Clone)]
pub struct ClusterKey {
    master: hmac::Key,
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

/// Why a message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no signature (a broker of another kaas version or cluster, or not a broker)")]
    Missing,
    #[error("bad signature for broker {0} (a different cluster key, or forged)")]
    Bad(i32),
    #[error("sent {0:?} away from this controller's clock (more than {MAX_CLOCK_SKEW:?}: replayed, or clocks far apart)")]
    Stale(Duration),
}

impl ClusterKey {
    /// A key from raw bytes (tests; [`Self::load`] for brokers).
    pub fn from_bytes(bytes: &[u8]) -> Self {
        Self {
            master: hmac::Key::new(hmac::HMAC_SHA256, bytes),
        }
    }

    /// The key in `file` if given, else `<shared>/__cluster/heartbeat.key`, created with a
    /// fresh random key by the first broker that finds none.
    pub fn load(shared_dir: &Path, file: Option<&Path>) -> io::Result<Self> {
        if let Some(file) = file {
            let bytes = std::fs::read(file)?;
            let bytes = trim_ascii(&bytes);
            if bytes.len() < MIN_KEY_BYTES {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: a cluster key needs at least {MIN_KEY_BYTES} bytes, found {}",
                        file.display(),
                        bytes.len()
                    ),
                ));
            }
            return Ok(Self::from_bytes(bytes));
        }
        let dir = shared_dir.join(crate::assignment::CLUSTER_DIR);
        let path = dir.join(KEY_FILE);
        if let Some(bytes) = crate::chain::read_optional(&path)? {
            return Ok(Self::from_bytes(&bytes));
        }
        kaas_durable::create_dir_all(&dir)?;
        let mut fresh = [0u8; KEY_BYTES];
        ring::rand::SystemRandom::new()
            .fill(&mut fresh)
            .map_err(|_| io::Error::other("no randomness for a cluster key"))?;
        // Written whole under a name of its own, then linked: another broker starting at the
        // same moment either links first (and we read its key) or reads ours, never half a
        // file. The name must be this writer's alone (`kaas_durable::unique_suffix`): with the
        // process id, three brokers in containers (each process 1) shared one temporary file,
        // removed it under each other and linked another's, and one kept a key it never wrote.
        let tmp = dir.join(format!(".{KEY_FILE}.{}.tmp", kaas_durable::unique_suffix()));
        let mut f = private_file(&tmp)?;
        let linked = f
            .write_all(&fresh)
            .and_then(|()| f.sync_all())
            .and_then(|()| std::fs::hard_link(&tmp, &path));
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => kaas_durable::sync_dir(&dir)?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        // The file is the key, whoever linked it.
        Ok(Self::from_bytes(&std::fs::read(&path)?))
    }

    fn broker_key(&self, broker_id: i32) -> hmac::Key {
        let derived = hmac::sign(&self.master, format!("kaas broker {broker_id}").as_bytes());
        hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref())
    }

    /// Signs a status as its `broker_id`, stamping the send time.
    pub fn sign_status(&self, mut status: BrokerStatus) -> Framed<BrokerStatus> {
        status.sent_at_unix_ms = now_unix_ms();
        let key = self.broker_key(status.broker_id);
        sign(&key, status, STATUS_AUTH_FIELD, |s| &mut s.auth)
    }

    /// Checks a status's signature, over the bytes it arrived as, and its send time.
    pub fn verify_status(&self, status: &Framed<BrokerStatus>) -> Result<(), AuthError> {
        let broker = status.message.broker_id;
        verify(
            &self.broker_key(broker),
            &status.wire,
            STATUS_AUTH_FIELD,
            broker,
        )?;
        let skew = now_unix_ms().abs_diff(status.message.sent_at_unix_ms);
        if skew > MAX_CLOCK_SKEW.as_millis() as u64 {
            return Err(AuthError::Stale(Duration::from_millis(skew)));
        }
        Ok(())
    }

    /// Signs a controller message for `broker_id`.
    pub fn sign_message(
        &self,
        mut message: ControllerMessage,
        broker_id: i32,
    ) -> Framed<ControllerMessage> {
        message.broker_id = broker_id;
        sign(
            &self.broker_key(broker_id),
            message,
            MESSAGE_AUTH_FIELD,
            |m| &mut m.auth,
        )
    }

    /// Checks that a controller message is signed for `me`, over the bytes it arrived as.
    pub fn verify_message(
        &self,
        message: &Framed<ControllerMessage>,
        me: i32,
    ) -> Result<(), AuthError> {
        if message.message.broker_id != me {
            return Err(if message.message.auth.is_empty() {
                AuthError::Missing
            } else {
                AuthError::Bad(message.message.broker_id)
            });
        }
        verify(&self.broker_key(me), &message.wire, MESSAGE_AUTH_FIELD, me)
    }
}

/// Field number of `BrokerStatus.auth` in `heartbeat.proto`.
const STATUS_AUTH_FIELD: u32 = 13;
/// Field number of `ControllerMessage.auth` in `heartbeat.proto`.
const MESSAGE_AUTH_FIELD: u32 = 4;

/// Encodes `message` without a signature, signs those bytes and appends the signature field,
/// which gives the same bytes as this version's encoding of the message with it (prost writes
/// fields in number order, and the signature has the highest number this version knows), so a
/// broker of the version before, which checks a re-encoding, accepts it. [`verify`] takes the
/// signature out wherever it is.
fn sign<M: Message>(
    key: &hmac::Key,
    mut message: M,
    field: u32,
    auth: impl Fn(&mut M) -> &mut Vec<u8>,
) -> Framed<M> {
    auth(&mut message).clear();
    let mut wire = message.encode_to_vec();
    let tag = hmac::sign(key, &wire);
    append_bytes_field(&mut wire, field, tag.as_ref());
    *auth(&mut message) = tag.as_ref().to_vec();
    Framed {
        message,
        wire: wire.into(),
    }
}

/// Checks the signature in field `field` of `wire` over the rest of `wire` as it arrived.
///
/// Not over a re-encoding of the decoded message: that drops the fields of a newer kaas this
/// one does not know, and would refuse every message of a newer broker in a rolling upgrade.
fn verify(key: &hmac::Key, wire: &[u8], field: u32, broker: i32) -> Result<(), AuthError> {
    let (signed, tag) = split_field(wire, field).map_err(|_| AuthError::Bad(broker))?;
    let tag = tag.filter(|t| !t.is_empty()).ok_or(AuthError::Missing)?;
    hmac::verify(key, &signed, tag).map_err(|_| AuthError::Bad(broker))
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn trim_ascii(bytes: &[u8]) -> &[u8] {
    // A key pasted into a Secret often ends with a newline.
    bytes.trim_ascii()
}

fn private_file(path: &PathBuf) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(id: i32) -> BrokerStatus {
        BrokerStatus {
            broker_id: id,
            advertised_host: "kaas-1".into(),
            advertised_port: 9092,
            sequence: 7,
            ..Default::default()
        }
    }

    /// The status as a forger would send it: the signed one changed, its signature kept.
    fn tampered(
        signed: &Framed<BrokerStatus>,
        change: impl FnOnce(&mut BrokerStatus),
    ) -> Framed<BrokerStatus> {
        let mut message = signed.message.clone();
        change(&mut message);
        Framed::new(message)
    }

    // Proves: a signed status verifies; changing any field, claiming another id, signing with
    // another cluster key, leaving it unsigned or replaying it late is refused.
    #[test]
    fn statuses_are_bound_to_the_key_the_id_and_the_time() {
        let key = ClusterKey::from_bytes(b"0123456789abcdef0123456789abcdef");
        let s = key.sign_status(status(1));
        assert_eq!(key.verify_status(&s), Ok(()));
        assert_eq!(
            s.wire,
            s.message.encode_to_vec(),
            "the bytes sent are the message's own encoding, signature included"
        );

        let moved = tampered(&s, |m| m.advertised_host = "203.0.113.7".into());
        assert_eq!(key.verify_status(&moved), Err(AuthError::Bad(1)));
        let other_id = tampered(&s, |m| m.broker_id = 2);
        assert_eq!(key.verify_status(&other_id), Err(AuthError::Bad(2)));
        let stranger = ClusterKey::from_bytes(b"another cluster's key, 32 bytes!");
        let forged = stranger.sign_status(status(1));
        assert_eq!(key.verify_status(&forged), Err(AuthError::Bad(1)));
        assert_eq!(
            key.verify_status(&Framed::new(status(1))),
            Err(AuthError::Missing)
        );
        let mut garbage = s.wire.to_vec();
        garbage.push(0x0b); // a group: not a field of any heartbeat message
        let garbage = Framed {
            wire: garbage.into(),
            ..s.clone()
        };
        assert_eq!(key.verify_status(&garbage), Err(AuthError::Bad(1)));

        // Signed with a send time an hour ago (as a replay would carry).
        let mut late = status(1);
        late.sent_at_unix_ms = now_unix_ms() - 3_600_000;
        let late = sign(&key.broker_key(1), late, STATUS_AUTH_FIELD, |m| &mut m.auth);
        assert!(matches!(key.verify_status(&late), Err(AuthError::Stale(_))));
    }

    /// A status or controller message from a newer kaas, with fields this version does not
    /// know, verifies: over a re-encoding of what this version decoded, those fields were
    /// missing and every such message was refused, so brokers of two versions could not
    /// heartbeat to each other in a rolling upgrade. Checked with the signature after the new
    /// fields (as `sign` writes it) and between the known and the new ones (a newer prost's
    /// encoding of the whole message, in field order).
    #[test]
    fn messages_from_a_newer_kaas_verify_with_the_fields_this_one_does_not_know() {
        let key = ClusterKey::from_bytes(b"0123456789abcdef0123456789abcdef");
        let mut newer = status(2);
        newer.sent_at_unix_ms = now_unix_ms();
        let known = newer.encode_to_vec();
        let mut added = Vec::new();
        prost::encoding::string::encode(14, &"zone-c/rack-9".to_owned(), &mut added);
        prost::encoding::uint64::encode(15, &42, &mut added);
        let signed_bytes = [known.clone(), added.clone()].concat();
        let tag = hmac::sign(&key.broker_key(2), &signed_bytes);

        let mut tag_last = signed_bytes.clone();
        append_bytes_field(&mut tag_last, STATUS_AUTH_FIELD, tag.as_ref());
        let mut tag_between = known;
        append_bytes_field(&mut tag_between, STATUS_AUTH_FIELD, tag.as_ref());
        tag_between.extend_from_slice(&added);
        for wire in [tag_last, tag_between] {
            let received = Framed {
                message: BrokerStatus::decode(&wire[..]).unwrap(),
                wire: wire.into(),
            };
            assert_eq!(key.verify_status(&received), Ok(()));
            let mut changed = received.wire.to_vec();
            *changed.last_mut().unwrap() ^= 1; // the newer field's value, forged
            let changed = Framed {
                wire: changed.into(),
                ..received
            };
            assert_eq!(key.verify_status(&changed), Err(AuthError::Bad(2)));
        }

        let mut to_three = ControllerMessage {
            broker_id: 3,
            ..Default::default()
        }
        .encode_to_vec();
        prost::encoding::uint64::encode(9, &7, &mut to_three);
        let tag = hmac::sign(&key.broker_key(3), &to_three);
        append_bytes_field(&mut to_three, MESSAGE_AUTH_FIELD, tag.as_ref());
        let received = Framed {
            message: ControllerMessage::decode(&to_three[..]).unwrap(),
            wire: to_three.into(),
        };
        assert_eq!(key.verify_message(&received, 3), Ok(()));
    }

    /// The field numbers the signatures are taken out by are those of `heartbeat.proto`.
    #[test]
    fn the_signature_fields_are_the_schemas_auth_fields() {
        let status = BrokerStatus {
            auth: b"tag".to_vec(),
            ..Default::default()
        };
        assert_eq!(
            split_field(&status.encode_to_vec(), STATUS_AUTH_FIELD),
            Ok((Vec::new(), Some(&b"tag"[..])))
        );
        let message = ControllerMessage {
            auth: b"tag".to_vec(),
            ..Default::default()
        };
        assert_eq!(
            split_field(&message.encode_to_vec(), MESSAGE_AUTH_FIELD),
            Ok((Vec::new(), Some(&b"tag"[..])))
        );
    }

    /// A controller message signed for one broker must not be replayable to another, or unsigned.
    #[test]
    fn controller_messages_are_for_one_broker() {
        let key = ClusterKey::from_bytes(b"0123456789abcdef0123456789abcdef");
        let m = key.sign_message(ControllerMessage::default(), 3);
        assert_eq!(key.verify_message(&m, 3), Ok(()));
        assert_eq!(key.verify_message(&m, 4), Err(AuthError::Bad(3)));
        let mut unsigned = m.message.clone();
        unsigned.auth.clear();
        assert_eq!(
            key.verify_message(&Framed::new(unsigned), 3),
            Err(AuthError::Missing)
        );
    }

    /// Brokers on one volume agree on a key without configuration; it is not world-readable.
    #[test]
    fn brokers_of_one_volume_share_one_generated_key() {
        let dir = tempfile::tempdir().unwrap();
        let a = ClusterKey::load(dir.path(), None).unwrap();
        let b = ClusterKey::load(dir.path(), None).unwrap();
        let s = a.sign_status(status(0));
        assert_eq!(b.verify_status(&s), Ok(()));
        let path = dir.path().join("__cluster").join(KEY_FILE);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let short = dir.path().join("short");
        std::fs::write(&short, b"tiny\n").unwrap();
        assert!(ClusterKey::load(dir.path(), Some(&short)).is_err());
    }

    /// Brokers starting at the same moment on one volume all start, with the same key — as
    /// threads of one process here, which share a process id as brokers in containers do
    /// (each is process 1). With the temporary file named by the process id, brokers removed
    /// each other's halfway: some failed to start, and one kept a key no other broker had.
    #[test]
    fn brokers_starting_together_agree_on_the_key() {
        const BROKERS: usize = 6;
        for round in 0..100 {
            let dir = tempfile::tempdir().unwrap();
            let start = std::sync::Arc::new(std::sync::Barrier::new(BROKERS));
            let keys: Vec<ClusterKey> = (0..BROKERS)
                .map(|_| {
                    let (shared, start) = (dir.path().to_path_buf(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        ClusterKey::load(&shared, None)
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|t| {
                    t.join()
                        .unwrap()
                        .unwrap_or_else(|e| panic!("round {round}: {e}"))
                })
                .collect();
            let on_disk = ClusterKey::load(dir.path(), None).unwrap();
            for (b, key) in keys.iter().enumerate() {
                let s = key.sign_status(status(b as i32));
                assert_eq!(
                    on_disk.verify_status(&s),
                    Ok(()),
                    "round {round}: broker {b} holds another key than the file"
                );
            }
        }
    }
}
