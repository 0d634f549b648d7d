//! The state file: what we write reads back equal, in Go's shape, and no file however
//! damaged panics the reader (or the restore that builds services from it).

use kamal_proxy::balancer::affinity::PinKey;
use kamal_proxy::balancer::health::HealthCheckConfig;
use kamal_proxy::balancer::rollout::RolloutSplit;
use kamal_proxy::balancer::target::validate_target;
use kamal_proxy::gotime::GoDuration;
use kamal_proxy::options::upstream::{PathTimeout, RetryOptions, UpstreamOptions};
use kamal_proxy::options::{ServiceOptions, TargetOptions, normalize_prefix};
use kamal_proxy::router::state::{self, ServiceState};
use kamal_proxy::service::ServiceConfig;
use kamal_proxy::service::pause::PauseSnapshot;
use proptest::prelude::*;
use serde_json::Value;

fn duration() -> impl Strategy<Value = GoDuration> {
    prop_oneof![
        Just(GoDuration::ZERO),
        (1i64..3_600).prop_map(GoDuration::from_secs),
        any::<i64>().prop_map(GoDuration::from_nanos),
    ]
}

fn words(pattern: &'static str, most: usize) -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(pattern, 0..=most)
}

fn target() -> impl Strategy<Value = String> {
    "[a-z0-9][a-z0-9_.-]{1,12}(:[0-9]{1,4})?"
}

/// A list of targets and its weights as the file keeps them: none when all are 1.
fn weighted_targets(most: usize) -> impl Strategy<Value = (Vec<String>, Vec<u32>)> {
    prop::collection::vec((target(), prop_oneof![Just(1u32), 1u32..=1000]), 0..=most).prop_map(
        |pairs| {
            let weights: Vec<u32> = pairs.iter().map(|(_, w)| *w).collect();
            let weights = if weights.iter().all(|&w| w == 1) {
                Vec::new()
            } else {
                weights
            };
            (pairs.into_iter().map(|(t, _)| t).collect(), weights)
        },
    )
}

/// A session affinity key, as the file keeps it (64 hex digits).
fn pin_key() -> impl Strategy<Value = Option<PinKey>> {
    prop::option::of("[0-9a-f]{64}".prop_map(|hex| {
        serde_json::from_value(Value::String(hex)).expect("64 hex digits are a key")
    }))
}

/// Options as a deploy leaves them (normalised); the text fields are arbitrary, as the
/// file does not re-validate them.
pub fn service_options() -> impl Strategy<Value = ServiceOptions> {
    (
        (
            prop_oneof![
                Just(vec![String::new()]),
                // No trailing dot: deploys store hosts without it.
                prop::collection::vec("[a-z0-9.*-]{0,19}[a-z0-9*-]", 1..3)
            ],
            prop::collection::vec(".{0,10}", 1..3),
            any::<(bool, bool, bool, bool)>(),
            (".{0,8}", ".{0,8}", ".{0,8}", "([a-z0-9.-]{0,7}[a-z0-9-])?"),
            (".{0,8}", ".{0,8}", ".{0,8}", ".{0,8}"),
        ),
        (
            duration(),
            words(".{0,8}", 2),
            duration(),
            duration(),
            words("[a-z0-9-]{1,8}", 2),
        ),
        (
            words("[0-9a-f.:/]{0,12}", 2),
            words("[0-9a-f.:/]{0,12}", 2),
            prop_oneof![
                Just(0.0),
                any::<f64>().prop_filter("finite", |f| f.is_finite()),
                0.0..100.0
            ],
            any::<i64>(),
            words("[0-9a-f.:/]{0,12}", 2),
            ".{0,20}",
            words(".{0,12}", 2),
            words(".{0,12}", 2),
            duration(),
        ),
    )
        .prop_map(|(a, b, c)| {
            let (
                hosts,
                prefixes,
                (tls, redirect, strip, ws),
                (cert, key, url, canonical),
                (dir, cache, pages, ip_header),
            ) = a;
            let (affinity, excluded, sleep_after, wake_timeout, sleep_containers) = b;
            let (
                allow_ips,
                trusted,
                rate_limit,
                burst,
                exempt,
                basic_auth,
                redirects,
                rewrites,
                request_timeout,
            ) = c;
            let mut o = ServiceOptions {
                hosts,
                path_prefixes: prefixes.iter().map(|p| normalize_prefix(p)).collect(),
                tls_enabled: tls,
                tls_certificate_path: cert,
                tls_private_key_path: key,
                tls_on_demand_url: url,
                tls_redirect: redirect,
                canonical_host: canonical,
                acme_directory: dir,
                acme_cache_path: cache,
                error_page_path: pages,
                strip_prefix: strip,
                writer_affinity_timeout: affinity,
                read_targets_accept_websockets: ws,
                exclude_metrics_paths: excluded,
                client_ip_header: ip_header.clone(),
                sleep_after,
                wake_timeout,
                // The newer sleep keys reuse generated values: any value must round-trip.
                freeze_after: wake_timeout,
                sleep_labels: sleep_containers.clone(),
                wake_page: ws,
                sleep_containers,
                allow_ips,
                trusted_proxies: trusted,
                rate_limit,
                rate_limit_burst: burst,
                rate_limit_exempt: exempt,
                basic_auth,
                redirects,
                rewrites,
                request_timeout,
                // Reused generated values, as above.
                session_affinity: redirect,
                session_affinity_cookie: ip_header.clone(),
                // The upstream keys reuse generated values too.
                retry: RetryOptions {
                    target_try_duration: request_timeout,
                    target_try_interval: affinity,
                },
            };
            o.normalize();
            o
        })
}

pub fn target_options() -> impl Strategy<Value = TargetOptions> {
    (
        (".{0,10}", any::<u16>(), duration(), duration(), ".{0,10}"),
        (duration(), any::<(bool, bool, bool, bool)>()),
        (any::<i64>(), any::<i64>(), any::<i64>()),
        (words("[A-Za-z-]{1,10}", 2), words("[A-Za-z-]{1,10}", 2)),
    )
        .prop_map(
            |(
                (path, port, interval, timeout, host),
                (response, (breq, bresp, fwd, scope)),
                (mem, req, resp),
                (logq, logr),
            )| TargetOptions {
                health_check_config: HealthCheckConfig {
                    path,
                    port,
                    interval,
                    timeout,
                    host,
                },
                response_timeout: response,
                buffer_requests: breq,
                buffer_responses: bresp,
                max_memory_buffer_size: mem,
                max_request_body_size: req,
                max_response_body_size: resp,
                log_request_headers: logq.clone(),
                log_response_headers: logr.clone(),
                forward_headers: fwd,
                scope_cookie_paths: scope,
                upstream: UpstreamOptions {
                    max_conns: mem,
                    max_idle_conns: req,
                    idle_conn_timeout: interval,
                    dial_timeout: timeout,
                    disable_keep_alives: scope,
                    path_timeouts: path_timeouts(&logq, response),
                    path_request_timeouts: path_timeouts(&logr, interval),
                },
            },
        )
}

/// Stored path timeouts: any prefix text, any duration (the file is not re-validated).
fn path_timeouts(prefixes: &[String], timeout: GoDuration) -> Vec<PathTimeout> {
    prefixes
        .iter()
        .map(|p| PathTimeout {
            path_prefix: p.clone(),
            timeout,
        })
        .collect()
}

fn rollout_controller() -> impl Strategy<Value = Option<RolloutSplit>> {
    prop::option::of((-5i64..=105, words("[a-z0-9]{1,6}", 2)).prop_map(
        |(percentage, allowlist)| RolloutSplit {
            percentage,
            percentage_split_point: u32::MAX as f64 * percentage as f64 / 100.0,
            allowlist,
        },
    ))
}

fn service_state() -> impl Strategy<Value = ServiceState> {
    (
        "[a-z0-9][a-z0-9_.-]{0,12}",
        service_options(),
        target_options(),
        (
            weighted_targets(2),
            weighted_targets(1),
            prop::option::of(weighted_targets(1)),
            prop::option::of(weighted_targets(1)),
            pin_key(),
        ),
        (0u8..3, ".{0,12}", any::<i64>()),
        rollout_controller(),
        (
            prop_oneof![Just(""), Just("active"), Just("sleeping"), Just("frozen")],
            prop::collection::vec("[0-9a-f]{1,12}", 0..2),
            0i64..4_000_000_000,
        ),
    )
        .prop_map(
            |(
                name,
                options,
                target_options,
                (active, readers, rollout, rollout_readers, session_affinity_key),
                (state, stop_message, fail_after),
                rollout_controller,
                (idle, idle_containers, idle_since),
            )| ServiceState {
                name,
                options,
                target_options,
                active_targets: active.0,
                active_target_weights: active.1,
                active_readers: readers.0,
                active_reader_weights: readers.1,
                rollout_target_weights: rollout.as_ref().map(|r| r.1.clone()).unwrap_or_default(),
                rollout_targets: rollout.map(|r| r.0),
                rollout_reader_weights: rollout_readers
                    .as_ref()
                    .map(|r| r.1.clone())
                    .unwrap_or_default(),
                rollout_readers: rollout_readers.map(|r| r.0),
                session_affinity_key,
                pause_controller: PauseSnapshot {
                    state,
                    stop_message,
                    fail_after,
                },
                rollout_controller,
                idle_state: idle.to_string(),
                idle_containers,
                idle_since,
                active_target: String::new(),
                rollout_target: String::new(),
                hosts: Vec::new(),
                path_prefixes: Vec::new(),
            },
        )
}

fn written(services: &[ServiceState]) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(services).unwrap();
    bytes.push(b'\n');
    bytes
}

/// Upstream's keys (kamal-proxy-upstream.md §6.2), which Go reads back after a rollback.
const GO_SERVICE_KEYS: &[&str] = &[
    "name",
    "options",
    "target_options",
    "active_targets",
    "active_readers",
    "rollout_targets",
    "rollout_readers",
    "pause_controller",
    "rollout_controller",
];
const GO_OPTIONS_KEYS: &[&str] = &[
    "hosts",
    "path_prefixes",
    "tls_enabled",
    "tls_certificate_path",
    "tls_private_key_path",
    "tls_on_demand_url",
    "tls_redirect",
    "canonical_host",
    "acme_directory",
    "acme_cache_path",
    "error_page_path",
    "strip_prefix",
    "writer_affinity_timeout",
    "read_targets_accept_websockets",
    "exclude_metrics_paths",
    "client_ip_header",
];
const GO_TARGET_KEYS: &[&str] = &[
    "health_check_config",
    "response_timeout",
    "buffer_requests",
    "buffer_responses",
    "max_memory_buffer_size",
    "max_request_body_size",
    "max_response_body_size",
    "log_request_headers",
    "log_response_headers",
    "forward_headers",
    "scope_cookie_paths",
];
const GO_HEALTH_KEYS: &[&str] = &["path", "port", "interval", "timeout", "host"];
const GO_PAUSE_KEYS: &[&str] = &["state", "stop_message", "fail_after"];
/// Go's legacy keys, read by Go too: ours must never collide with them either.
const GO_LEGACY_KEYS: &[&str] = &["active_target", "rollout_target"];

/// Every Go key is present, and no key of ours matches a Go key case-insensitively
/// (Go's decoder folds case, so `Hosts` beside `hosts` would overwrite it).
fn check_go_keys(object: &Value, go: &[&str]) -> Result<(), TestCaseError> {
    let map = object
        .as_object()
        .ok_or_else(|| TestCaseError::fail("not an object"))?;
    for key in go {
        prop_assert!(map.contains_key(*key), "missing Go key {}", key);
    }
    for key in map.keys() {
        if !go.contains(&key.as_str()) {
            let clash = go
                .iter()
                .chain(GO_LEGACY_KEYS)
                .find(|g| g.eq_ignore_ascii_case(key));
            prop_assert!(
                clash.is_none(),
                "added key {} folds onto Go's {:?}",
                key,
                clash
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::FEW))]

    /// What we write reads back equal.
    #[test]
    fn written_state_reads_back_equal(services in prop::collection::vec(service_state(), 0..4)) {
        let back = state::parse(&written(&services)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(back, services);
    }

    /// What we write is upstream's shape: a top-level array, Go's keys and types.
    #[test]
    fn written_state_has_go_shape(services in prop::collection::vec(service_state(), 1..3)) {
        let file: Value = serde_json::from_slice(&written(&services)).unwrap();
        let array = file.as_array().ok_or_else(|| TestCaseError::fail("not an array"))?;
        for s in array {
            check_go_keys(s, GO_SERVICE_KEYS)?;
            check_go_keys(&s["options"], GO_OPTIONS_KEYS)?;
            check_go_keys(&s["target_options"], GO_TARGET_KEYS)?;
            check_go_keys(&s["target_options"]["health_check_config"], GO_HEALTH_KEYS)?;
            check_go_keys(&s["pause_controller"], GO_PAUSE_KEYS)?;
            for d in [
                &s["options"]["writer_affinity_timeout"],
                &s["target_options"]["response_timeout"],
                &s["target_options"]["health_check_config"]["interval"],
                &s["target_options"]["health_check_config"]["timeout"],
                &s["pause_controller"]["fail_after"],
            ] {
                prop_assert!(d.is_i64(), "a duration is integer nanoseconds: {}", d);
            }
            prop_assert!(s["active_targets"].is_array() && s["active_readers"].is_array());
            prop_assert!(s["rollout_targets"].is_null() || s["rollout_targets"].is_array());
            // Weights or not, upstream's lists hold plain `host:port`, which Go accepts.
            for list in ["active_targets", "active_readers", "rollout_targets", "rollout_readers"] {
                for t in s[list].as_array().into_iter().flatten() {
                    let t = t.as_str().unwrap_or_default();
                    prop_assert_eq!(validate_target(t), Ok(()), "{} in {}", t, list);
                }
            }
        }
    }

    /// The atomic save and the load agree through the real file.
    #[test]
    fn saved_files_load_back(services in prop::collection::vec(service_state(), 0..3)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kamal-proxy.state");
        state::save(&path, &services).unwrap();
        prop_assert_eq!(state::load(&path).unwrap(), Some(services));
    }

    /// Any bytes: services or a clear error, never a panic.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..200),
        "[\\[\\]{}\",:0-9a-z_ -]{0,80}".prop_map(String::into_bytes),
    ]) {
        let _ = state::parse(&bytes);
    }

    /// A valid file with one value replaced by any JSON value: parsed or refused, and
    /// what parses restores (services built, gates compiled) without a panic.
    #[test]
    fn damaged_files_never_panic_the_restore(services in prop::collection::vec(service_state(), 1..2), path in any::<prop::sample::Index>(), replacement in json_value()) {
        let mut file: Value = serde_json::from_slice(&written(&services)).unwrap();
        replace_somewhere(&mut file, path, replacement);
        let bytes = serde_json::to_vec(&file).unwrap();
        if let Ok(parsed) = state::parse(&bytes) {
            for s in parsed {
                let mut options = s.options.clone();
                options.error_page_path.clear(); // no file system in a property
                let _ = ServiceConfig::build(&s.name, options, s.target_options.clone());
            }
        }
    }
}

pub fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        prop_oneof![Just(1e-300), Just(1e-20), Just(-0.0), Just(5e-324)].prop_map(Value::from),
        ".{0,10}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 12, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Replaces the value at a position picked by `at` among all nodes of `root`.
pub fn replace_somewhere(root: &mut Value, at: prop::sample::Index, with: Value) {
    fn count(v: &Value) -> usize {
        1 + match v {
            Value::Array(a) => a.iter().map(count).sum(),
            Value::Object(o) => o.values().map(count).sum(),
            _ => 0,
        }
    }
    fn walk(v: &mut Value, mut n: usize, with: Value) -> Result<(), (usize, Value)> {
        if n == 0 {
            *v = with;
            return Ok(());
        }
        n -= 1;
        let mut with = with;
        let children: Vec<&mut Value> = match v {
            Value::Array(a) => a.iter_mut().collect(),
            Value::Object(o) => o.values_mut().collect(),
            _ => Vec::new(),
        };
        for child in children {
            match walk(child, n, with) {
                Ok(()) => return Ok(()),
                Err((left, back)) => {
                    n = left;
                    with = back;
                }
            }
        }
        Err((n, with))
    }
    let n = at.index(count(root));
    let _ = walk(root, n, with);
}

/// The fuzzer's seed files stay valid, so each run starts from real state files.
#[test]
fn fuzz_seed_state_files_parse() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/state_file");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let services = state::parse(&std::fs::read(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!services.is_empty(), "{}", path.display());
        for s in services {
            ServiceConfig::build(&s.name, s.options.clone(), s.target_options.clone())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
        seen += 1;
    }
    assert!(seen >= 3);
}
