//! `--redirect` and `--rewrite` rules, applied to any request path.
#![no_main]

use http::{HeaderValue, Request};
use kamal_proxy::options::ServiceOptions;
use kamal_proxy::service::gates::redirect::location;
use kamal_proxy::service::gates::rewrite::rewrite;
use kamal_proxy::service::gates::rules::{Kind, RuleSet};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (&str, &str, &str)| {
    let (rule, path, host) = input;
    let rules = [rule.to_string()];
    if let Ok(set) = RuleSet::parse(&rules, Kind::Redirect) {
        let _ = set.apply(path);
        let Ok(req) = Request::builder().uri(path).header("host", host).body(()) else {
            return;
        };
        let options = ServiceOptions {
            canonical_host: "canonical.test".into(),
            ..Default::default()
        };
        for tls in [false, true] {
            if let Some((_, to)) = location(&req, &options, &set, tls) {
                // The Location must be a header value (a rule's capture is encoded), unless
                // the client's own Host made it otherwise.
                if HeaderValue::from_str(host).is_ok() {
                    assert!(HeaderValue::from_str(&to).is_ok(), "{to:?}");
                }
            }
        }
    }
    if let Ok(set) = RuleSet::parse(&rules, Kind::Rewrite) {
        let _ = set.apply(path);
        if let Ok(uri) = path.parse::<http::Uri>() {
            let _ = rewrite(&set, uri.path(), uri.query(), "/", true);
            let _ = rewrite(&set, uri.path(), uri.query(), "/app", true);
        }
    }
});
