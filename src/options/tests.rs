use super::*;
use crate::gotime::GoDuration;

fn tls(hosts: &[&str]) -> ServiceOptions {
    ServiceOptions {
        hosts: hosts.iter().map(|s| s.to_string()).collect(),
        tls_enabled: true,
        tls_redirect: true,
        ..Default::default()
    }
}

#[test]
fn prefixes_normalise() {
    assert_eq!(normalize_prefix("api"), "/api");
    assert_eq!(normalize_prefix("/api/"), "/api");
    assert_eq!(normalize_prefix("a/b/"), "/a/b");
    assert_eq!(normalize_prefix("/"), "/");
    assert_eq!(normalize_prefix(""), "/");
}

#[test]
fn validation_messages_match_upstream() {
    let e = |o: ServiceOptions| o.validate().unwrap_err();
    assert_eq!(
        e(tls(&[])),
        "service options invalid: host must be set when using TLS"
    );
    let mut o = tls(&["a.com"]);
    o.path_prefixes = vec!["/api".into()];
    assert_eq!(
        e(o),
        "service options invalid: TLS settings must be specified on the root path service"
    );
    let mut o = tls(&[]);
    o.tls_enabled = false;
    o.tls_on_demand_url = "/allow".into();
    assert_eq!(
        e(o),
        "service options invalid: TLS must be enabled to use a TLS on-demand URL"
    );
    let mut o = tls(&["a.com"]);
    o.tls_on_demand_url = "/allow".into();
    assert_eq!(
        e(o),
        "service options invalid: cannot set hosts when using a TLS on-demand URL"
    );
    let o = ServiceOptions {
        hosts: vec!["a.com".into(), "b.com".into()],
        canonical_host: "c.com".into(),
        ..Default::default()
    };
    assert_eq!(
        e(o),
        "service options invalid: canonical-host 'c.com' must be present in the hosts list: [a.com b.com]"
    );
    let o = ServiceOptions {
        canonical_host: "c.com".into(),
        ..Default::default()
    };
    assert!(o.validate().is_ok());
}

#[test]
fn sleep_validation() {
    let o = ServiceOptions {
        sleep_after: GoDuration::from_nanos(-1),
        ..Default::default()
    };
    assert!(
        o.validate()
            .unwrap_err()
            .ends_with("sleep-after and wake-timeout cannot be negative")
    );
    let o = ServiceOptions {
        wake_timeout: GoDuration::from_nanos(-1),
        ..Default::default()
    };
    assert!(o.validate().unwrap_err().ends_with("cannot be negative"));
    let o = ServiceOptions {
        sleep_containers: vec!["x".into()],
        ..Default::default()
    };
    // The command line alone cannot tell: a container label may give sleep-after.
    assert!(o.validate().is_ok());
    assert_eq!(
        o.validate_complete().unwrap_err(),
        "service options invalid: sleep-container requires sleep-after or freeze-after"
    );
    let mut o = tls(&[]);
    o.tls_on_demand_url = "/allow".into();
    o.sleep_after = GoDuration::from_secs(1);
    assert!(
        o.validate()
            .unwrap_err()
            .ends_with("sleep-after cannot be used with a TLS on-demand URL")
    );
}

#[test]
fn freeze_label_and_wake_page_validation() {
    let secs = GoDuration::from_secs;
    let err = |o: ServiceOptions| o.validate().unwrap_err();
    let p = "service options invalid: ";
    assert_eq!(
        err(ServiceOptions {
            freeze_after: GoDuration::from_nanos(-1),
            ..Default::default()
        }),
        format!("{p}freeze-after cannot be negative")
    );
    assert_eq!(
        err(ServiceOptions {
            freeze_after: secs(60),
            sleep_after: secs(60),
            ..Default::default()
        }),
        format!("{p}freeze-after (1m0s) must be shorter than sleep-after (1m0s)")
    );
    // Either tier alone, or freeze first.
    for (freeze, sleep) in [(60, 0), (0, 60), (30, 60)] {
        let o = ServiceOptions {
            freeze_after: secs(freeze),
            sleep_after: secs(sleep),
            ..Default::default()
        };
        assert!(o.validate().is_ok() && o.validate_complete().is_ok());
        assert!(o.sleep_enabled());
    }
    let mut frozen_only = ServiceOptions {
        freeze_after: secs(5),
        ..Default::default()
    };
    frozen_only.normalize();
    assert_eq!(frozen_only.wake_timeout, DEFAULT_WAKE_TIMEOUT);
    for bad in ["service", "=app", " service=app", ""] {
        assert_eq!(
            err(ServiceOptions {
                sleep_labels: vec![bad.into()],
                ..Default::default()
            }),
            format!("{p}sleep-label must be given as \"<key>=<value>\", got \"{bad}\"")
        );
    }
    assert_eq!(
        err(ServiceOptions {
            sleep_after: secs(60),
            sleep_labels: vec!["service=app".into()],
            sleep_containers: vec!["web".into()],
            ..Default::default()
        }),
        format!("{p}sleep-label and sleep-container cannot be used together")
    );
    let incomplete = |o: ServiceOptions| o.validate_complete().unwrap_err();
    assert_eq!(
        incomplete(ServiceOptions {
            sleep_labels: vec!["service=app".into()],
            ..Default::default()
        }),
        format!("{p}sleep-label requires sleep-after or freeze-after")
    );
    assert_eq!(
        incomplete(ServiceOptions {
            wake_page: true,
            ..Default::default()
        }),
        format!("{p}wake-page requires sleep-after or freeze-after")
    );
}

#[test]
fn wake_timeout_defaults_only_when_sleeping() {
    let mut o = ServiceOptions {
        sleep_after: GoDuration::from_secs(1),
        ..Default::default()
    };
    o.normalize();
    assert_eq!(o.wake_timeout, DEFAULT_WAKE_TIMEOUT);
    let mut o = ServiceOptions::default();
    o.normalize();
    assert_eq!(o.wake_timeout, GoDuration::ZERO);
}

#[test]
fn service_names() {
    assert!(validate_service_name("app-web_production.1").is_ok());
    assert_eq!(
        validate_service_name("").unwrap_err(),
        "service name must not be empty"
    );
    assert!(
        validate_service_name(&"a".repeat(256))
            .unwrap_err()
            .contains("256 bytes")
    );
    assert!(
        validate_service_name("a\u{1b}[31m")
            .unwrap_err()
            .contains("not allowed")
    );
    assert!(validate_service_name("a b").is_err());
    assert!(validate_host(&"h".repeat(254)).is_err());
}

#[test]
fn on_demand_urls() {
    assert!(validate_on_demand_url("/allow-host").is_ok());
    assert!(validate_on_demand_url("https://x.com/check").is_ok());
    assert!(
        validate_on_demand_url("allow-host")
            .unwrap_err()
            .starts_with("unable to parse")
    );
    assert_eq!(
        validate_on_demand_url("ftp://x").unwrap_err(),
        "unsupported scheme \"ftp\" in tls-on-demand-url"
    );
    assert_eq!(
        validate_on_demand_url("http://").unwrap_err(),
        "missing host in tls-on-demand-url"
    );
    assert!(
        validate_on_demand_url("//x.com/a")
            .unwrap_err()
            .contains("must be a path")
    );
}

#[test]
fn state_keys_roundtrip_and_null_slices() {
    let json =
        r#"{"hosts":null,"path_prefixes":["/"],"exclude_metrics_paths":null,"tls_redirect":true}"#;
    let o: ServiceOptions = serde_json::from_str(json).unwrap();
    assert!(o.hosts.is_empty());
    assert!(o.tls_redirect);
    let out = serde_json::to_string(&o).unwrap();
    assert!(!out.contains("sleep_after"));
    // Unset gates are omitted, so files stay upstream-shaped and older files load.
    for key in [
        "allow_ips",
        "rate_limit",
        "basic_auth",
        "redirects",
        "request_timeout",
    ] {
        assert!(!out.contains(key), "{key} in {out}");
    }
    assert_eq!(o.rate_limit, 0.0);
    assert!(o.allow_ips.is_empty() && o.basic_auth.is_empty());
}
