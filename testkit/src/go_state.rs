//! Go kamal-proxy's view of a state file, so tests can show that a user who rolls back to
//! the Go image keeps every service.
//!
//! `GO_FIXTURE` is a state file in the form Go kamal-proxy's HEAD writes it
//! (encoding/json: one compact line, `<`, `>`, `&` escaped, `null` for nil slices,
//! durations as integer nanoseconds, a trailing newline) for five services as Kamal
//! deploys them; `GO_V0_9_2_FIXTURE` holds the same services as v0.9.2 (the release
//! Kamal's `MINIMUM_VERSION` names) writes them: without the three keys added after it
//! (`tls_on_demand_url`, `exclude_metrics_paths`, `client_ip_header`, upstream §0.2).
//! Both are written from upstream's struct definitions and field order
//! (`internal/server/service.go` `marshalledService` and the structs it embeds, upstream
//! §6.2): no Go toolchain or kamal-proxy source can be fetched on this machine, so they
//! were not produced by running Go. `GO_SCHEMA` is the type of each of upstream's keys as
//! Go's decoder reads it.

use serde_json::Value;

pub const GO_FIXTURE: &str = include_str!("../../tests/fixtures/go-kamal-proxy.state");
pub const GO_V0_9_2_FIXTURE: &str =
    include_str!("../../tests/fixtures/go-kamal-proxy-v0.9.2.state");

/// The keys of `GO_SCHEMA` that v0.9.2's structs do not have yet (upstream §0.2): its
/// decoder ignores them, and a file it wrote lacks them.
pub const NEWER_THAN_V0_9_2: [&str; 3] = [
    "tls_on_demand_url",
    "exclude_metrics_paths",
    "client_ip_header",
];

/// A Go release whose decoder a state file must satisfy.
#[derive(Clone, Copy, Debug)]
pub enum GoRelease {
    /// v0.9.2, the oldest release Kamal boots.
    V0_9_2,
    /// Upstream's HEAD: every key of `GO_SCHEMA`.
    Head,
}

/// Go's field types, by JSON key. `[string]` is a Go `[]string` (null decodes as nil),
/// `[target]` one whose every entry must match upstream's target pattern
/// `^(\w[-_.\w+]+)(:\d+)?$` (Go refuses the whole file otherwise, so a weight written
/// into `active_targets` would lose every service after a rollback),
/// `int` a Go integer or `time.Duration` (a JSON number with no fraction that fits in
/// 64 bits), `object?` a pointer to a struct (null or an object).
pub const GO_SCHEMA: &str = r#"{
  "name": "string",
  "options": {
    "hosts": "[string]", "path_prefixes": "[string]", "tls_enabled": "bool",
    "tls_certificate_path": "string", "tls_private_key_path": "string",
    "tls_on_demand_url": "string", "tls_redirect": "bool", "canonical_host": "string",
    "acme_directory": "string", "acme_cache_path": "string", "error_page_path": "string",
    "strip_prefix": "bool", "writer_affinity_timeout": "int",
    "read_targets_accept_websockets": "bool", "exclude_metrics_paths": "[string]",
    "client_ip_header": "string"
  },
  "target_options": {
    "health_check_config": {
      "path": "string", "port": "int", "interval": "int", "timeout": "int", "host": "string"
    },
    "response_timeout": "int", "buffer_requests": "bool", "buffer_responses": "bool",
    "max_memory_buffer_size": "int", "max_request_body_size": "int",
    "max_response_body_size": "int", "log_request_headers": "[string]",
    "log_response_headers": "[string]", "forward_headers": "bool",
    "scope_cookie_paths": "bool"
  },
  "active_targets": "[target]", "active_readers": "[target]",
  "rollout_targets": "[target]", "rollout_readers": "[target]",
  "pause_controller": { "state": "int", "stop_message": "string", "fail_after": "int" },
  "rollout_controller": "object?"
}"#;

/// Checks that a whole state file decodes as Go's `[]*Service`: a top-level array whose
/// services carry every one of upstream's keys with a value of the type Go's field
/// takes, and no added key that Go's case-insensitive matching would read into one of
/// its fields.
pub fn check_go_decodable(file: &Value) -> Result<(), String> {
    check_go_decodable_by(file, GoRelease::Head)
}

/// `check_go_decodable` against one release's fields.
pub fn check_go_decodable_by(file: &Value, release: GoRelease) -> Result<(), String> {
    let mut schema: Value = serde_json::from_str(GO_SCHEMA).expect("GO_SCHEMA is JSON");
    if let GoRelease::V0_9_2 = release {
        let options = schema["options"].as_object_mut().expect("options");
        for key in NEWER_THAN_V0_9_2 {
            options.remove(key).expect("a key of GO_SCHEMA");
        }
    }
    let services = file
        .as_array()
        .ok_or_else(|| format!("top level is not an array: {file}"))?;
    for (i, service) in services.iter().enumerate() {
        check_object(service, &schema, &format!("[{i}]"))?;
    }
    Ok(())
}

fn check_object(ours: &Value, schema: &Value, at: &str) -> Result<(), String> {
    let ours = ours
        .as_object()
        .ok_or_else(|| format!("{at} is not an object"))?;
    let schema = schema.as_object().expect("schema object");
    for (key, kind) in schema {
        let value = ours
            .get(key)
            .ok_or_else(|| format!("{at}.{key} is missing"))?;
        let here = format!("{at}.{key}");
        match kind {
            Value::Object(_) => check_object(value, kind, &here)?,
            Value::String(k) => check_kind(value, k, &here)?,
            other => panic!("bad schema entry {other}"),
        }
    }
    for key in ours.keys() {
        if let Some(go_key) = schema
            .keys()
            .find(|g| g.eq_ignore_ascii_case(key) && *g != key)
        {
            return Err(format!(
                "{at}.{key} would be read by Go as its field \"{go_key}\""
            ));
        }
    }
    Ok(())
}

fn check_kind(value: &Value, kind: &str, at: &str) -> Result<(), String> {
    let ok = match kind {
        "string" => value.is_string(),
        "bool" => value.is_boolean(),
        "int" => value.is_i64(),
        "[string]" => {
            value.is_null()
                || value
                    .as_array()
                    .is_some_and(|a| a.iter().all(Value::is_string))
        }
        "[target]" => {
            value.is_null()
                || value.as_array().is_some_and(|a| {
                    a.iter()
                        .all(|t| t.as_str().is_some_and(matches_go_target_pattern))
                })
        }
        "object?" => value.is_null() || value.is_object(),
        other => panic!("bad schema kind {other}"),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{at} is {value}, which Go cannot decode as {kind}"))
    }
}

/// Upstream's `^(\w[-_.\w+]+)(:\d+)?$` (`internal/server/target.go`), by hand.
pub fn matches_go_target_pattern(target: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let (host, port) = match target.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (target, None),
    };
    let mut chars = host.chars();
    let host_ok = chars.next().is_some_and(word)
        && chars.clone().next().is_some()
        && chars.all(|c| word(c) || matches!(c, '-' | '_' | '.' | '+'));
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    host_ok && port_ok
}

/// `ours` reduced to the keys `go` has, recursively: what Go reads of our file.
pub fn as_go_reads_it(ours: &Value, go: &Value) -> Value {
    match (ours, go) {
        (Value::Object(o), Value::Object(g)) => Value::Object(
            g.iter()
                .map(|(k, gv)| {
                    let ov = o.get(k).unwrap_or(&Value::Null);
                    (k.clone(), as_go_reads_it(ov, gv))
                })
                .collect(),
        ),
        (Value::Array(o), Value::Array(g)) if o.len() == g.len() => Value::Array(
            o.iter()
                .zip(g)
                .map(|(ov, gv)| as_go_reads_it(ov, gv))
                .collect(),
        ),
        _ => ours.clone(),
    }
}
