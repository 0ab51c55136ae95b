//! FindCoordinator: which broker coordinates a group (and why no transaction coordinator is
//! offered).

use super::*;

/// The coordinator of `key` as (node id, host, port). Single-node: the registered broker list
/// is this broker, so the design's rule always answers this broker.
pub(super) fn coordinator_address(shard: &Shard, key: &str) -> Option<(i32, String, i32)> {
    let id = shard.cluster.coordinator(key)?;
    shard
        .cluster
        .brokers()
        .into_iter()
        .find(|b| b.id == id)
        .map(|b| (b.id, b.host, i32::from(b.port)))
}

/// (node id, host, port), or (error code, message).
pub(super) type CoordinatorAnswer = Result<(i32, String, i32), (i16, String)>;

/// Why a transactional producer cannot start (see `find_coordinator`).
pub const TRANSACTIONS_UNSUPPORTED: &str = "kaas does not serve transactions yet: use an idempotent producer (enable.idempotence=true, no transactional.id)";

pub fn find_coordinator(
    shard: &Shard,
    req: FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    let keys: Vec<String> = if version >= 4 {
        req.coordinator_keys.iter().map(|k| k.to_string()).collect()
    } else {
        vec![req.key.to_string()]
    };
    // 0 = group, 1 = transaction, 2 = share group.
    let answers: Vec<(String, CoordinatorAnswer)> = keys
        .into_iter()
        .map(|k| {
            let r = if req.key_type == 1 {
                // Transactions are not served. Clients treat this code as fatal at once
                // (librdkafka, Java, franz-go), with this message, instead of retrying
                // InitProducerId until their timeout.
                Err((
                    errors::TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                    TRANSACTIONS_UNSUPPORTED.to_string(),
                ))
            } else if req.key_type != 0 {
                Err((
                    errors::INVALID_REQUEST,
                    format!("Invalid coordinator type {}", req.key_type),
                ))
            } else {
                coordinator_address(shard, &k).ok_or((
                    errors::COORDINATOR_NOT_AVAILABLE,
                    "no broker is alive to coordinate".to_string(),
                ))
            };
            (k, r)
        })
        .collect();
    find_coordinator_response(answers, version)
}

/// The FindCoordinator answer: batched (v4+) or the single-key fields (v0-3).
pub(super) fn find_coordinator_response(
    answers: Vec<(String, CoordinatorAnswer)>,
    version: i16,
) -> FindCoordinatorResponse {
    let mut resp = FindCoordinatorResponse::default();
    if version >= 4 {
        resp.coordinators = answers
            .into_iter()
            .map(|(k, r)| {
                let c = Coordinator::default().with_key(s(&k));
                match r {
                    // Kafka's batched answer carries "" as a found coordinator's message.
                    Ok((id, host, port)) => c
                        .with_node_id(BrokerId(id))
                        .with_host(s(&host))
                        .with_port(port)
                        .with_error_message(Some(s(""))),
                    Err((code, msg)) => c
                        .with_node_id(BrokerId(-1))
                        .with_host(s(""))
                        .with_port(-1)
                        .with_error_code(code)
                        .with_error_message(Some(s(&msg))),
                }
            })
            .collect();
    } else {
        let (_, r) = answers.into_iter().next().expect("one key");
        match r {
            Ok((id, host, port)) => {
                resp.node_id = BrokerId(id);
                resp.host = s(&host);
                resp.port = port;
                // Kafka's single-key answer names the error even on success.
                resp.error_message = Some(s("NONE"));
            }
            Err((code, msg)) => {
                resp.error_code = code;
                resp.node_id = BrokerId(-1);
                resp.port = -1;
                resp.error_message = (version >= 1).then(|| s(&msg));
            }
        }
        if version == 0 {
            resp.error_message = Some(s(""));
        }
    }
    resp
}
