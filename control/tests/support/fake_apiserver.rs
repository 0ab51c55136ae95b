//! An in-repo stand-in for kube-apiserver's Lease endpoints, so the backend's tests run in
//! every `cargo test` without a cluster (`lease_kube_real.rs` runs the same scenarios against a
//! real kube-apiserver when one is available): `GET`, `POST`, `PUT` and merge-`PATCH` of
//! `/apis/coordination.k8s.io/v1/namespaces/{ns}/leases[/{name}]` over HTTP/1.1 on 127.0.0.1,
//! with the real API's optimistic concurrency — a `PUT` or `PATCH` whose `metadata.resourceVersion`
//! differs from the stored one, or a `POST` of an existing name, is a 409 `Status` object, and
//! every successful write gets a fresh `resourceVersion` — and JSON shaped like the real API's.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const PREFIX: &str = "/apis/coordination.k8s.io/v1/namespaces/";

/// What the server stores and counts.
#[derive(Default)]
pub struct Store {
    /// (namespace, name) → the stored Lease object.
    pub leases: HashMap<(String, String), Value>,
    /// The last resourceVersion handed out (etcd's revision, in the real server).
    pub revision: u64,
    /// Successful writes, and writes refused with 409.
    pub writes: u64,
    pub conflicts: u64,
    /// `PUT`s (or `PATCH`es) without a resourceVersion: the real apiserver accepts them unconditionally for
    /// Leases, so a backend that sent one would have no fencing. Tests assert it stays 0.
    pub unconditional_puts: u64,
}

/// A running fake apiserver; stops when dropped.
pub struct FakeApiserver {
    pub addr: SocketAddr,
    pub store: Arc<Mutex<Store>>,
    task: JoinHandle<()>,
}

impl Drop for FakeApiserver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeApiserver {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let store = Arc::new(Mutex::new(Store::default()));
        let shared = Arc::clone(&store);
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(serve(conn, Arc::clone(&shared)));
            }
        });
        Self { addr, store, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The stored Lease, if any.
    pub fn lease(&self, ns: &str, name: &str) -> Option<Value> {
        let store = self.store.lock().unwrap();
        store.leases.get(&(ns.into(), name.into())).cloned()
    }
}

/// Serves one keep-alive connection: requests with `Content-Length` bodies (what kube sends).
async fn serve(conn: TcpStream, store: Arc<Mutex<Store>>) {
    let mut conn = BufReader::new(conn);
    loop {
        let mut request_line = String::new();
        if conn.read_line(&mut request_line).await.unwrap_or(0) == 0 {
            return;
        }
        let mut parts = request_line.split_whitespace();
        let method = parts.next().unwrap_or("").to_owned();
        let target = parts.next().unwrap_or("").to_owned();
        let mut content_length = 0usize;
        loop {
            let mut line = String::new();
            if conn.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    content_length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; content_length];
        if conn.read_exact(&mut body).await.is_err() {
            return;
        }
        let path = target.split('?').next().unwrap_or("");
        let (code, reply) = handle(&store, &method, path, &body);
        let reply = reply.to_string();
        let head = format!(
            "HTTP/1.1 {code} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            reason(code),
            reply.len()
        );
        let conn = conn.get_mut();
        if conn.write_all(head.as_bytes()).await.is_err()
            || conn.write_all(reply.as_bytes()).await.is_err()
        {
            return;
        }
    }
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        _ => "Error",
    }
}

/// The real API's error object.
fn status(code: u16, reason: &str, message: String) -> (u16, Value) {
    (
        code,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": message, "reason": reason, "code": code,
        }),
    )
}

fn handle(store: &Mutex<Store>, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let Some(rest) = path.strip_prefix(PREFIX) else {
        return status(404, "NotFound", format!("no route {path}"));
    };
    let segments: Vec<&str> = rest.split('/').collect();
    let mut store = store.lock().unwrap();
    match (method, segments.as_slice()) {
        ("GET", [ns, "leases", name]) => match store.leases.get(&((*ns).into(), (*name).into())) {
            Some(lease) => (200, lease.clone()),
            None => status(
                404,
                "NotFound",
                format!("leases.coordination.k8s.io \"{name}\" not found"),
            ),
        },
        ("POST", [ns, "leases"]) => {
            let Ok(mut lease) = serde_json::from_slice::<Value>(body) else {
                return status(400, "BadRequest", "body is not JSON".into());
            };
            let Some(name) = lease["metadata"]["name"].as_str().map(str::to_owned) else {
                return status(400, "BadRequest", "metadata.name required".into());
            };
            let key = ((*ns).to_owned(), name.clone());
            if store.leases.contains_key(&key) {
                store.conflicts += 1;
                return status(
                    409,
                    "AlreadyExists",
                    format!("leases.coordination.k8s.io \"{name}\" already exists"),
                );
            }
            store.revision += 1;
            store.writes += 1;
            stamp(&mut lease, ns, store.revision);
            store.leases.insert(key, lease.clone());
            (201, lease)
        }
        // PUT replaces, PATCH merges (RFC 7386). Both with the real API's rules: the body's
        // resourceVersion, if any, must match the stored one, and a missing Lease is 404.
        (verb @ ("PUT" | "PATCH"), [ns, "leases", name]) => {
            let Ok(body) = serde_json::from_slice::<Value>(body) else {
                return status(400, "BadRequest", "body is not JSON".into());
            };
            let key = ((*ns).to_owned(), (*name).to_owned());
            let Some(current) = store.leases.get(&key).cloned() else {
                return status(
                    404,
                    "NotFound",
                    format!("leases.coordination.k8s.io \"{name}\" not found"),
                );
            };
            match body["metadata"]["resourceVersion"].as_str() {
                None | Some("") => store.unconditional_puts += 1,
                Some(v) if Some(v) != current["metadata"]["resourceVersion"].as_str() => {
                    store.conflicts += 1;
                    return status(
                        409,
                        "Conflict",
                        format!(
                            "Operation cannot be fulfilled on leases.coordination.k8s.io \
                             \"{name}\": the object has been modified; please apply your \
                             changes to the latest version and try again"
                        ),
                    );
                }
                Some(_) => {}
            }
            let mut lease = body;
            if verb == "PATCH" {
                let patch = lease;
                lease = current;
                merge_patch(&mut lease, &patch);
            }
            store.revision += 1;
            store.writes += 1;
            stamp(&mut lease, ns, store.revision);
            store.leases.insert(key, lease.clone());
            (200, lease)
        }
        _ => status(405, "MethodNotAllowed", format!("{method} {path}")),
    }
}

/// RFC 7386: objects merge key by key, `null` removes a key, anything else replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let object = target.as_object_mut().expect("made an object above");
    for (key, value) in fields {
        if value.is_null() {
            object.remove(key);
        } else {
            merge_patch(object.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// What the apiserver fills in on every write.
fn stamp(lease: &mut Value, ns: &str, revision: u64) {
    lease["apiVersion"] = json!("coordination.k8s.io/v1");
    lease["kind"] = json!("Lease");
    lease["metadata"]["namespace"] = json!(ns);
    lease["metadata"]["resourceVersion"] = json!(revision.to_string());
}
